// The longhaul-fake-apiserver binary (flags, URL on stdout, kubeconfig, clean SIGTERM) and the
// TLS mode (a client verifying the server against the generated CA).
#include <csignal>

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <longhaul/base/file.h>

#include "longhaul/testing/temp_dir.h"
#include "test_fixture.h"

namespace longhaul::fakeapi::testing {
namespace {

// Reads one line from `fd` within `timeout`; empty on timeout or EOF.
std::string read_line(int fd, std::chrono::milliseconds timeout) {
  std::string line;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "";
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return "";
    char c;
    if (::read(fd, &c, 1) != 1) return "";
    if (c == '\n') return line;
    line.push_back(c);
  }
}

TEST(FakeApiServerBinary, ServesWritesKubeconfigAndStopsOnSigterm) {
  longhaul::testing::TempDir dir("fakeapi-binary");
  std::string kubeconfig = (dir / "kubeconfig").string();
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    ::execl(LONGHAUL_FAKE_APISERVER_BINARY, LONGHAUL_FAKE_APISERVER_BINARY, "--port", "0",
            "--kubeconfig-out", kubeconfig.c_str(), "--token", "tok", nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string url = read_line(out[0], std::chrono::seconds(20));
  ASSERT_EQ(url.rfind("http://127.0.0.1:", 0), 0u) << "printed: '" << url << "'";
  int port = std::stoi(url.substr(url.rfind(':') + 1));
  std::string config = longhaul::file::read_file(kubeconfig);
  EXPECT_NE(config.find("server: " + url), std::string::npos) << config;
  EXPECT_NE(config.find("token: \"tok\""), std::string::npos) << config;

  TestHttpClient client(port, "tok");
  EXPECT_EQ(client.post(kPods, pod("a")).status, 201);
  EXPECT_EQ(client.get(kPods + "/a").status, 200);
  TestHttpClient anonymous(port);
  EXPECT_EQ(anonymous.get(kPods).status, 401);
  TestHttpClient watch(port, "tok");
  watch.start_watch(kPods + "?watch=true");  // an open stream must not block the shutdown

  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  ::close(out[0]);
}

class TlsTest : public FakeApiTest {
 protected:
  Options options() override {
    Options o = FakeApiTest::options();
    o.tls.enabled = true;
    return o;
  }
};

TEST_F(TlsTest, ClientVerifyingTheCaCanUseTheApi) {
  EXPECT_EQ(server_->url().rfind("https://127.0.0.1:", 0), 0u);
  ASSERT_FALSE(server_->ca_file().empty());
  EXPECT_EQ(client_->post(kPods, pod("a")).status, 201);
  EXPECT_EQ(client_->get(kPods + "/a").json_body()["metadata"]["name"], "a");

  TestHttpClient watch(server_->port(), "", server_->ca_file());
  watch.start_watch(kPods + "?watch=true");
  std::optional<json> e = watch.next_event();
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["object"]["metadata"]["name"], "a");
  client_->del(kPods + "/a");
  std::optional<json> deleted = watch.next_event();
  ASSERT_TRUE(deleted);
  EXPECT_EQ((*deleted)["type"], "DELETED");

  auto config = server_->ca_file().parent_path() / "kubeconfig";
  server_->write_kubeconfig(config);
  EXPECT_NE(longhaul::file::read_file(config).find("certificate-authority-data: "),
            std::string::npos);
}

TEST_F(TlsTest, ClientWithAnotherCaIsRejected) {
  // A second server's CA did not sign this server's certificate.
  Options other_options;
  other_options.tls.enabled = true;
  FakeApiServer other(other_options);
  other.start();
  TestHttpClient wrong_ca(server_->port(), "", other.ca_file());
  EXPECT_THROW(wrong_ca.get(kPods), std::runtime_error);
}

}  // namespace
}  // namespace longhaul::fakeapi::testing
