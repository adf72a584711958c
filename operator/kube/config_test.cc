// Kubeconfig parsing, in-cluster config and token rotation.
#include "longhaul/kube/config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "longhaul/base/error.h"
#include "longhaul/testing/temp_dir.h"

namespace longhaul::kube {
namespace {

using longhaul::testing::TempDir;

namespace fs = std::filesystem;

// "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n" in base64.
constexpr char kCaPem[] = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
constexpr char kCaData[] =
    "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=";

std::string kubeconfig_with(const std::string& cluster, const std::string& user,
                            const std::string& extra_contexts = "") {
  return "apiVersion: v1\nkind: Config\ncurrent-context: dev\n"
         "clusters:\n- name: dev-cluster\n  cluster:\n" +
         cluster +
         "contexts:\n- name: dev\n  context:\n    cluster: dev-cluster\n    user: dev-user\n"
         "    namespace: team-a\n" +
         extra_contexts + "users:\n- name: dev-user\n  user:\n" + user;
}

TEST(KubeconfigTest, TokenAndCaDataFromCurrentContext) {
  TempDir dir("kube_config_test");
  std::string path = dir.file("config", kubeconfig_with("    server: https://10.0.0.1:6443\n"
                                                        "    certificate-authority-data: " +
                                                            std::string(kCaData) + "\n",
                                                        "    token: abc123\n"));
  ClusterConfig config = load_kubeconfig(path);
  EXPECT_EQ(config.server, "https://10.0.0.1:6443");
  EXPECT_EQ(config.tls.ca_pem, kCaPem);
  EXPECT_TRUE(config.tls.ca_file.empty());
  EXPECT_FALSE(config.tls.insecure_skip_tls_verify);
  EXPECT_EQ(config.token, "abc123");
  EXPECT_EQ(config.default_namespace, "team-a");
}

TEST(KubeconfigTest, CaFileRelativeToKubeconfigAndClientCertificateFiles) {
  TempDir dir("kube_config_test");
  dir.file("ca.crt", kCaPem);
  dir.file("client.crt", "cert");
  dir.file("client.key", "key");
  std::string path = dir.file("config", kubeconfig_with("    server: https://k8s.example:443\n"
                                                        "    certificate-authority: ca.crt\n",
                                                        "    client-certificate: client.crt\n"
                                                        "    client-key: client.key\n"));
  ClusterConfig config = load_kubeconfig(path);
  EXPECT_EQ(config.tls.ca_file, (dir / "ca.crt").string());
  EXPECT_EQ(config.tls.client_cert_file, (dir / "client.crt").string());
  EXPECT_EQ(config.tls.client_key_file, (dir / "client.key").string());
  EXPECT_TRUE(config.token.empty());
}

TEST(KubeconfigTest, ClientCertificateDataAndInsecureSkipOnlyWhenAsked) {
  TempDir dir("kube_config_test");
  std::string path = dir.file("config", kubeconfig_with("    server: https://k8s.example:443\n"
                                                        "    insecure-skip-tls-verify: true\n",
                                                        "    client-certificate-data: Y2VydA==\n"
                                                        "    client-key-data: a2V5\n"));
  ClusterConfig config = load_kubeconfig(path);
  EXPECT_TRUE(config.tls.insecure_skip_tls_verify);
  EXPECT_EQ(config.tls.client_cert_pem, "cert");
  EXPECT_EQ(config.tls.client_key_pem, "key");
}

TEST(KubeconfigTest, NamedContextAndTokenFile) {
  TempDir dir("kube_config_test");
  dir.file("token", "from-file\n");
  std::string other = "- name: prod\n  context:\n    cluster: prod-cluster\n    user: prod-user\n";
  std::string text = kubeconfig_with("    server: https://dev:443\n", "    token: dev\n", other) +
                     "- name: prod-user\n  user:\n    tokenFile: token\n";
  text += "";
  // A second cluster appended to the clusters list.
  text.replace(text.find("contexts:"), 0,
               "- name: prod-cluster\n  cluster:\n    server: https://prod:443\n");
  std::string path = dir.file("config", text);
  ClusterConfig config = load_kubeconfig(path, "prod");
  EXPECT_EQ(config.server, "https://prod:443");
  EXPECT_EQ(config.token_file, (dir / "token").string());
  EXPECT_EQ(config.default_namespace, "default");
  EXPECT_EQ(TokenSource(config.token, config.token_file).token(), "from-file");
}

TEST(KubeconfigTest, KubeconfigEnvironmentVariable) {
  TempDir dir("kube_config_test");
  std::string path =
      dir.file("config", kubeconfig_with("    server: https://env:443\n", "    token: t\n"));
  ::setenv("KUBECONFIG", ((dir / "missing").string() + ":" + path).c_str(), 1);
  ClusterConfig config = load_kubeconfig();
  ::unsetenv("KUBECONFIG");
  EXPECT_EQ(config.server, "https://env:443");
}

// Each broken kubeconfig must fail with a message naming the file and the missing piece.
struct BrokenKubeconfig {
  const char* name;
  std::string text;
  std::string context;
  std::vector<std::string> message_parts;
};

class BrokenKubeconfigTest : public ::testing::TestWithParam<BrokenKubeconfig> {};

TEST_P(BrokenKubeconfigTest, ErrorNamesPathAndField) {
  TempDir dir("kube_config_test");
  std::string path = dir.file("config", GetParam().text);
  try {
    load_kubeconfig(path, GetParam().context);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const auto& part : GetParam().message_parts) {
      EXPECT_NE(message.find(part), std::string::npos) << message << " lacks " << part;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BrokenKubeconfigTest,
    ::testing::Values(
        BrokenKubeconfig{"NoServer",
                         kubeconfig_with("    insecure-skip-tls-verify: false\n", "    token: t\n"),
                         "",
                         {"cluster 'dev-cluster'", "'server'"}},
        BrokenKubeconfig{"UnknownContext",
                         kubeconfig_with("    server: https://a:1\n", "    token: t\n"),
                         "nope",
                         {"context 'nope'"}},
        BrokenKubeconfig{"MissingCaFile",
                         kubeconfig_with("    server: https://a:1\n"
                                         "    certificate-authority: /nonexistent/ca.crt\n",
                                         "    token: t\n"),
                         "",
                         {"certificate-authority", "/nonexistent/ca.crt"}},
        BrokenKubeconfig{
            "CertWithoutKey",
            kubeconfig_with("    server: https://a:1\n", "    client-certificate-data: Y2VydA==\n"),
            "",
            {"user 'dev-user'", "client-key"}},
        BrokenKubeconfig{"BadBase64",
                         kubeconfig_with("    server: https://a:1\n"
                                         "    certificate-authority-data: '***'\n",
                                         "    token: t\n"),
                         "",
                         {"certificate-authority-data", "base64"}},
        BrokenKubeconfig{
            "NoCurrentContext", "apiVersion: v1\nkind: Config\n", "", {"current-context"}},
        BrokenKubeconfig{
            "ExecPlugin",
            kubeconfig_with("    server: https://a:1\n", "    exec:\n      command: aws\n"),
            "",
            {"exec"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(KubeconfigTest, MissingFileIsNotFound) {
  EXPECT_THROW(load_kubeconfig("/nonexistent/kubeconfig"), NotFound);
}

TEST(InClusterConfigTest, ReadsEnvironmentAndServiceAccountFiles) {
  TempDir dir("kube_config_test");
  InClusterPaths paths{dir.file("token", "tok-1\n"), dir.file("ca.crt", kCaPem),
                       dir.file("namespace", "longhaul-system\n")};
  ::setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  ClusterConfig config = load_in_cluster_config(paths);
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  ::unsetenv("KUBERNETES_SERVICE_PORT");
  EXPECT_EQ(config.server, "https://10.96.0.1:443");
  EXPECT_EQ(config.tls.ca_file, paths.ca_file);
  EXPECT_EQ(config.default_namespace, "longhaul-system");
  EXPECT_EQ(config.token_file, paths.token_file);
  EXPECT_EQ(TokenSource(config.token, config.token_file).token(), "tok-1");
}

TEST(InClusterConfigTest, OutsideAPodFailsClearly) {
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_THROW(load_in_cluster_config(), FailedPrecondition);
}

TEST(TokenSourceTest, RotatedTokenFileIsReadAgain) {
  TempDir dir("kube_config_test");
  std::string path = dir.file("token", "first\n");
  TokenSource tokens("", path);
  EXPECT_EQ(tokens.token(), "first");
  // kubelet rotates projected tokens by an atomic rename.
  dir.file("token.new", "second\n");
  fs::rename((dir / "token.new").string(), path);
  EXPECT_EQ(tokens.token(), "second");
  // Mid-rotation (file briefly absent) the last token keeps working.
  fs::remove(path);
  EXPECT_EQ(tokens.token(), "second");
}

TEST(TokenSourceTest, FixedToken) { EXPECT_EQ(TokenSource("abc", "").token(), "abc"); }

}  // namespace
}  // namespace longhaul::kube
