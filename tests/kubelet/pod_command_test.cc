// How a pod spec becomes a local command: mount paths, env, TF_CONFIG addresses, entrypoints.
#include "longhaul/kubelet/pod_command.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include <longhaul/base/error.h>

namespace longhaul::kubelet {
namespace {

struct MountCase {
  std::string name, text, mount, local, want;
};
void PrintTo(const MountCase& c, std::ostream* os) { *os << c.name; }
class ReplaceMountPath : public ::testing::TestWithParam<MountCase> {};

TEST_P(ReplaceMountPath, ReplacesOnlyWholePathPrefixes) {
  const MountCase& c = GetParam();
  EXPECT_EQ(replace_mount_path(c.text, c.mount, c.local), c.want);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ReplaceMountPath,
    ::testing::Values(
        MountCase{"Exact", "/logdir", "/logdir", "/r/pvc/x", "/r/pvc/x"},
        MountCase{"Below", "/logdir/run1", "/logdir", "/r/p", "/r/p/run1"},
        MountCase{"InFlag", "--logdir=/logdir/a", "/logdir", "/r/p", "--logdir=/r/p/a"},
        MountCase{"TrailingSlashMount", "/logdir/a", "/logdir/", "/r/p", "/r/p/a"},
        MountCase{"LongerNameUntouched", "/logdirs/a", "/logdir", "/r/p", "/logdirs/a"},
        MountCase{"SuffixOfOtherPathUntouched", "/x/logdir", "/logdir", "/r/p", "/x/logdir"},
        MountCase{"Twice", "/d:/d/e", "/d", "/L", "/L:/L/e"},
        MountCase{"RootMountIgnored", "/a/b", "/", "/L", "/a/b"}),
    [](const auto& info) { return info.param.name; });

TEST(ExpandReferences, FollowsKubernetesRules) {
  const std::map<std::string, std::string> vars = {{"A", "1"}, {"B", "two"}};
  EXPECT_EQ(expand_references("$(A)-$(B)", vars), "1-two");
  EXPECT_EQ(expand_references("$(MISSING)", vars), "$(MISSING)");
  EXPECT_EQ(expand_references("$$(A)", vars), "$(A)");
  EXPECT_EQ(expand_references("cost $5", vars), "cost $5");
  EXPECT_EQ(expand_references("$(A", vars), "$(A");
}

TEST(ImageBasename, StripsRegistryTagAndDigest) {
  EXPECT_EQ(image_basename("ghcr.io/longhaul-dev/longhaul-worker:0.1.0"), "longhaul-worker");
  EXPECT_EQ(image_basename("busybox"), "busybox");
  EXPECT_EQ(image_basename("localhost:5000/a/b@sha256:abc"), "b");
}

TEST(PortMap, GivesEveryAddressItsOwnStablePort) {
  PortMap ports(41000);
  EXPECT_EQ(ports.local_address("j-chief-0.j.default.svc:2222"), "127.0.0.1:41000");
  EXPECT_EQ(ports.local_address("j-worker-0.j.default.svc:2222"), "127.0.0.1:41001");
  EXPECT_EQ(ports.local_address("j-chief-0.j.default.svc:2222"), "127.0.0.1:41000");
  EXPECT_EQ(ports.local_address("no-port"), "no-port");
  PortMap ephemeral;
  const int a = ephemeral.port_for("a:1"), b = ephemeral.port_for("b:1");
  EXPECT_GT(a, 0);
  EXPECT_NE(a, b);
  EXPECT_EQ(ephemeral.port_for("a:1"), a);
}

json operator_style_pod() {
  json tf = {{"cluster",
              {{"chief", {"j-chief-0.j.ns1.svc:2222"}},
               {"worker", {"j-worker-0.j.ns1.svc:2222", "j-worker-1.j.ns1.svc:2222"}}}},
             {"task", {{"type", "worker"}, {"index", 1}}}};
  return {
      {"metadata",
       {{"name", "j-worker-1"}, {"namespace", "ns1"}, {"uid", "u-1"}, {"labels", {{"app", "x"}}}}},
      {"spec",
       {{"hostname", "j-worker-1"},
        {"nodeName", "node-a"},
        {"volumes",
         {{{"name", "longhaul-logdir"}, {"persistentVolumeClaim", {{"claimName", "j-logdir"}}}},
          {{"name", "scratch"}, {"emptyDir", json::object()}},
          {{"name", "cfg"}, {"configMap", {{"name", "c"}}}}}},
        {"containers",
         {{{"name", "trainer"},
           {"image", "ghcr.io/longhaul-dev/longhaul-worker:0.1.0"},
           {"args", {"train", "--set=checkpoint.init_from=/logdir/init.safetensors", "$(RUN)"}},
           {"volumeMounts",
            {{{"name", "longhaul-logdir"}, {"mountPath", "/logdir"}},
             {{"name", "scratch"}, {"mountPath", "/scratch"}},
             {{"name", "cfg"}, {"mountPath", "/etc/cfg"}}}},
           {"env",
            {{{"name", "TF_CONFIG"}, {"value", tf.dump()}},
             {{"name", "LONGHAUL_CHIEF_ADDRESS"}, {"value", "j-chief-0.j.ns1.svc:2222"}},
             {{"name", "LONGHAUL_LOGDIR"}, {"value", "/logdir"}},
             {{"name", "RUN"}, {"value", "--run=$(POD)"}},
             {{"name", "POD"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.name"}}}}}},
             {{"name", "IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
             {{"name", "APP"},
              {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.labels['app']"}}}}}},
             {{"name", "SECRET"},
              {"valueFrom", {{"secretKeyRef", {{"name", "s"}, {"key", "k"}}}}}}}}}}}}}};
}

std::string env_of(const PodCommand& c, const std::string& k) {
  std::string v = "<unset>";
  for (const auto& [key, value] : c.env) {
    if (key == k) v = value;
  }
  return v;
}

TEST(BuildPodCommand, MapsAnOperatorPodOntoTheLocalMachine) {
  PortMap ports(42000);
  CommandOptions o;
  o.root = "/r";
  o.pod_dir = "/r/pods/ns1/j-worker-1";
  o.bin_dirs = {"/opt/bin"};
  o.ports = &ports;
  const PodCommand c = build_pod_command(operator_style_pod(), o);

  // No command: the image's basename is the entrypoint; args follow; paths are mapped.
  ASSERT_EQ(c.argv.size(), 4u);
  EXPECT_NE(c.argv[0].find("longhaul-worker"), std::string::npos);
  EXPECT_EQ(c.argv[1], "train");
  EXPECT_EQ(c.argv[2], "--set=checkpoint.init_from=/r/pvc/ns1/j-logdir/init.safetensors");
  EXPECT_EQ(c.argv[3], "--run=$(POD)");  // RUN was defined before POD: left as written

  EXPECT_EQ(env_of(c, "LONGHAUL_LOGDIR"), "/r/pvc/ns1/j-logdir");
  EXPECT_EQ(env_of(c, "POD"), "j-worker-1");
  EXPECT_EQ(env_of(c, "IP"), "127.0.0.1");
  EXPECT_EQ(env_of(c, "APP"), "x");
  EXPECT_EQ(env_of(c, "HOSTNAME"), "j-worker-1");
  EXPECT_EQ(env_of(c, "SECRET"), "");
  EXPECT_EQ(env_of(c, "PATH").rfind("/opt/bin:", 0), 0u);
  // Every replica agrees on the local addresses: chief first, then workers in order.
  const json tf = json::parse(env_of(c, "TF_CONFIG"));
  EXPECT_EQ(tf["cluster"]["chief"][0], "127.0.0.1:42000");
  EXPECT_EQ(tf["cluster"]["worker"][0], "127.0.0.1:42001");
  EXPECT_EQ(tf["cluster"]["worker"][1], "127.0.0.1:42002");
  EXPECT_EQ(tf["task"]["index"], 1);
  EXPECT_EQ(env_of(c, "LONGHAUL_CHIEF_ADDRESS"), "127.0.0.1:42000");
  EXPECT_EQ(env_of(c, "LONGHAUL_HOST_OVERRIDE"), "127.0.0.1");

  ASSERT_EQ(c.volumes.size(), 2u);
  EXPECT_EQ(c.volumes[0].local, "/r/pvc/ns1/j-logdir");
  EXPECT_EQ(c.volumes[1].local, "/r/pods/ns1/j-worker-1/volumes/scratch");
  EXPECT_EQ(c.working_dir, "/r/pods/ns1/j-worker-1");
  // The config map volume and the secret are reported, not silently dropped.
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_NE(c.warnings[0].find("cfg"), std::string::npos);
  EXPECT_NE(c.warnings[1].find("SECRET"), std::string::npos);
}

TEST(BuildPodCommand, CommandReplacesTheEntrypointAndEntrypointsMapImages) {
  json pod = {
      {"metadata", {{"name", "p"}, {"namespace", "default"}}},
      {"spec",
       {{"containers",
         {{{"name", "c"}, {"image", "busybox"}, {"command", {"/bin/sh", "-c", "exit 3"}}}}}}}};
  CommandOptions o;
  o.root = "/r";
  o.pod_dir = "/r/pods/default/p";
  EXPECT_EQ(build_pod_command(pod, o).argv, (std::vector<std::string>{"/bin/sh", "-c", "exit 3"}));

  pod["spec"]["containers"][0].erase("command");
  pod["spec"]["containers"][0]["args"] = {"-c", "true"};
  o.entrypoints = {{"busybox", "/bin/sh"}};
  EXPECT_EQ(build_pod_command(pod, o).argv, (std::vector<std::string>{"/bin/sh", "-c", "true"}));

  pod["spec"]["containers"] = json::array();
  EXPECT_THROW(build_pod_command(pod, o), InvalidArgument);
}

// Regression: the end-to-end scenarios compared a pod's parameters with a reference process that
// inherited OPENBLAS_CORETYPE while the pod did not; the two used different BLAS kernels.
TEST(BuildPodCommand, HostBlasTuningReachesThePodAsItReachesAReferenceProcess) {
  const char* saved = std::getenv("OPENBLAS_CORETYPE");
  const std::string previous = saved ? saved : "";
  ::setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  json pod = {{"metadata", {{"name", "p"}, {"namespace", "default"}}},
              {"spec", {{"containers", {{{"name", "c"}, {"command", {"/bin/true"}}}}}}}};
  CommandOptions o;
  o.root = "/r";
  o.pod_dir = "/r/pods/default/p";
  const PodCommand c = build_pod_command(pod, o);
  EXPECT_EQ(env_of(c, "OPENBLAS_CORETYPE"), "Haswell");
  // The reference environment is the pod's host part, entry for entry.
  for (const auto& [k, v] : passed_host_environment(o)) EXPECT_EQ(env_of(c, k), v) << k;
  if (saved) {
    ::setenv("OPENBLAS_CORETYPE", previous.c_str(), 1);
  } else {
    ::unsetenv("OPENBLAS_CORETYPE");
  }
}

}  // namespace
}  // namespace longhaul::kubelet
