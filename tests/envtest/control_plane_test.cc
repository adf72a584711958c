// The control plane itself: it serves a real v1.26+ API server, its controller manager gives new
// namespaces their default ServiceAccount and garbage-collects owned objects, minted
// ServiceAccount tokens authenticate as that account under RBAC, and the processes die with the
// program that started them even when it is SIGKILLed.
#include <fstream>
#include <thread>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "longhaul/envtest/gtest.h"
#include "longhaul/kube/config.h"

namespace longhaul::envtest {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

template <typename Pred>
bool eventually(Pred pred, std::chrono::seconds timeout = 60s) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return pred();
}

class ControlPlaneTest : public RealServerTest {};

TEST_F(ControlPlaneTest, ServesAKubernetes126OrLaterApiServer) {
  const json version = plane().call("GET", "/version");
  EXPECT_EQ(version.value("major", ""), "1");
  EXPECT_GE(std::stoi(version.value("minor", "0")), 26) << version.dump();
  EXPECT_EQ(plane().request("GET", "/readyz", "", "", "text/plain").status, 200);
}

TEST_F(ControlPlaneTest, AdminKubeconfigWorksWithTheOperatorsClient) {
  const kube::ClusterConfig config = kube::load_kubeconfig(plane().admin_kubeconfig().string());
  EXPECT_EQ(config.server, plane().server());
  kube::HttpClient client(config);
  const std::string ns = fresh_namespace();
  const kube::Resource configmaps{"", "v1", "configmaps", true, "ConfigMap"};
  client.create(configmaps, ns,
                {{"apiVersion", "v1"},
                 {"kind", "ConfigMap"},
                 {"metadata", {{"name", "hello"}}},
                 {"data", {{"a", "b"}}}});
  EXPECT_EQ(client.get(configmaps, ns, "hello")["data"]["a"], "b");
}

TEST_F(ControlPlaneTest, NewNamespaceGetsItsDefaultServiceAccountAndAcceptsPods) {
  const std::string ns = fresh_namespace();
  const json pod =
      plane().call("POST", "/api/v1/namespaces/" + ns + "/pods",
                   {{"apiVersion", "v1"},
                    {"kind", "Pod"},
                    {"metadata", {{"name", "p"}}},
                    {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}});
  EXPECT_EQ(pod["spec"].value("serviceAccountName", ""), "default");
  EXPECT_EQ(pod["status"].value("phase", ""), "Pending");  // no scheduler, no kubelet
}

TEST_F(ControlPlaneTest, MintedTokenAuthenticatesAsTheServiceAccountUnderRbac) {
  const std::string ns = fresh_namespace();
  plane().ensure_service_account(ns, "reader");
  const std::string token = plane().mint_token(ns, "reader");
  const fs::path kubeconfig = plane().work_dir() / ("reader-" + ns + ".kubeconfig");
  plane().write_kubeconfig(kubeconfig, token, ns);
  kube::HttpClient client(kube::load_kubeconfig(kubeconfig.string()));

  // Authenticated (not 401) but not authorized yet (403).
  try {
    client.list(kube::resources::kPods, ns, {});
    FAIL() << "a fresh ServiceAccount could list pods";
  } catch (const kube::ApiError& e) {
    EXPECT_EQ(e.http_status(), 403) << e.what();
    EXPECT_NE(std::string(e.what()).find("system:serviceaccount:" + ns + ":reader"),
              std::string::npos)
        << e.what();
  }
  plane().apply({{"apiVersion", "rbac.authorization.k8s.io/v1"},
                 {"kind", "Role"},
                 {"metadata", {{"name", "pod-reader"}, {"namespace", ns}}},
                 {"rules", {{{"apiGroups", {""}}, {"resources", {"pods"}}, {"verbs", {"list"}}}}}});
  plane().apply(
      {{"apiVersion", "rbac.authorization.k8s.io/v1"},
       {"kind", "RoleBinding"},
       {"metadata", {{"name", "pod-reader"}, {"namespace", ns}}},
       {"roleRef",
        {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "Role"}, {"name", "pod-reader"}}},
       {"subjects", {{{"kind", "ServiceAccount"}, {"name", "reader"}, {"namespace", ns}}}}});
  EXPECT_TRUE(eventually([&] {
    try {
      client.list(kube::resources::kPods, ns, {});
      return true;
    } catch (const kube::ApiError&) {
      return false;
    }
  }));
}

TEST_F(ControlPlaneTest, GarbageCollectorDeletesWhatAnOwnerOwned) {
  const std::string ns = fresh_namespace();
  const std::string path = "/api/v1/namespaces/" + ns + "/configmaps";
  const json owner = plane().call(
      "POST", path,
      {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "owner"}}}});
  plane().call("POST", path,
               {{"apiVersion", "v1"},
                {"kind", "ConfigMap"},
                {"metadata",
                 {{"name", "owned"},
                  {"ownerReferences",
                   {{{"apiVersion", "v1"},
                     {"kind", "ConfigMap"},
                     {"name", "owner"},
                     {"uid", owner["metadata"]["uid"]}}}}}}});
  plane().call("DELETE", path + "/owner");
  EXPECT_TRUE(eventually([&] { return plane().request("GET", path + "/owned").status == 404; }))
      << "the controller manager's garbage collector did not delete the owned ConfigMap";
}

TEST_F(ControlPlaneTest, CrdInstallsAndIsServed) {
  plane().install_crd(source_dir() / "crds" / "trainingjobs.longhaul.dev.yaml");
  const kube::Resource r = plane().resource_for("longhaul.dev/v1alpha1", "TrainingJob");
  EXPECT_EQ(r.plural, "trainingjobs");
  EXPECT_TRUE(r.namespaced);
}

// The crash path: a program holding a control plane is SIGKILLed; its etcd, API server and
// controller manager must not outlive it.
bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] == 'Z';
}

TEST_F(ControlPlaneTest, ComponentsDieWithAProgramThatIsKilled) {
  const fs::path info = plane().work_dir() / "killed-tool.json";
  const pid_t tool = ::fork();
  if (tool == 0) {
    const int null_fd = ::open("/dev/null", O_WRONLY);
    ::dup2(null_fd, STDOUT_FILENO);
    ::execl(LONGHAUL_ENVTEST_BINARY, LONGHAUL_ENVTEST_BINARY, "--no-crds", "--info-file",
            info.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(tool, 0);
  ASSERT_TRUE(eventually([&] { return fs::exists(info); }, 240s))
      << "longhaul-envtest did not become ready";
  json started;
  std::ifstream(info) >> started;
  const std::vector<pid_t> pids = started["pids"].get<std::vector<pid_t>>();
  ASSERT_EQ(pids.size(), 3u) << started.dump();
  for (pid_t pid : pids) EXPECT_FALSE(process_gone(pid));

  ::kill(tool, SIGKILL);
  int status = 0;
  ::waitpid(tool, &status, 0);
  for (pid_t pid : pids) {
    EXPECT_TRUE(eventually([&] { return process_gone(pid); }, 30s))
        << "component " << pid << " outlived the killed longhaul-envtest";
  }
}

}  // namespace
}  // namespace longhaul::envtest
