#include "longhaul/base/http_server.h"

#include <string>
#include <vector>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/base/error.h"

namespace longhaul::http {
namespace {

std::string get(int port, const std::string& target) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = "GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n";
    (void)!::write(fd, request.data(), request.size());
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) reply.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return reply;
}

Server metrics_server() {
  return Server("test metrics", "127.0.0.1", 0, [](std::string_view method, std::string_view path) {
    if (method == "GET" && path == "/metrics") return Response{200, "text/plain", "up 1\n"};
    if (path == "/boom") throw Internal("handler failed");
    return Response{404, "text/plain", "not found\n"};
  });
}

TEST(HttpServer, AnswersTheHandlersResponseWithLengthAndQueryStripped) {
  Server server = metrics_server();
  server.start();
  ASSERT_GT(server.port(), 0);
  const std::string reply = get(server.port(), "/metrics?x=1");
  EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << reply;
  EXPECT_NE(reply.find("Content-Length: 5\r\n"), std::string::npos) << reply;
  EXPECT_EQ(reply.substr(reply.size() - 5), "up 1\n");
  EXPECT_EQ(get(server.port(), "/other").rfind("HTTP/1.1 404 Not Found", 0), 0u);
  // A throwing handler is a 500 with the message, and the server keeps serving.
  EXPECT_NE(get(server.port(), "/boom").find("500 Internal Server Error"), std::string::npos);
  EXPECT_EQ(get(server.port(), "/metrics").rfind("HTTP/1.1 200", 0), 0u);
  server.stop();
  EXPECT_EQ(get(server.port(), "/metrics"), "");  // nothing listens after stop()
}

int connect_idle(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

// Regression: the server handled one connection at a time with a 2 s read timeout, so 50 idle
// clients made a scrape wait ~100 s (Prometheus gives up after 10 s) and a slow client held up
// the exit after SIGTERM. Idle clients are now served side by side with the scrape, each until
// its own deadline, and the server closes them when it stops. The scrape below is bounded by a
// 10 s receive timeout: the old server would have answered it only after 50 x 2 s.
TEST(HttpServer, IdleClientsDoNotHoldUpAScrapeOrTheStop) {
  Server server = metrics_server();
  server.start();
  std::vector<int> idle;
  for (int i = 0; i < 50; ++i) idle.push_back(connect_idle(server.port()));
  const int fd = connect_idle(server.port());
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string reply;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) reply.append(buf, static_cast<size_t>(n));
  ::close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << "no answer within 10 s: " << reply;
  server.stop();  // returns with the idle clients still connected
  for (int c : idle) {
    // The server closed them: a read sees the end of the stream (or a reset), never blocks.
    timeval short_tv{10, 0};
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &short_tv, sizeof short_tv);
    EXPECT_LE(::read(c, buf, sizeof buf), 0);
    ::close(c);
  }
}

TEST(HttpServer, BusyPortIsUnavailableNamingThePort) {
  Server first = metrics_server();
  first.start();
  Server second("test metrics", "127.0.0.1", first.port(), nullptr);
  try {
    second.start();
    FAIL() << "expected Unavailable";
  } catch (const Unavailable& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos)
        << e.what();
  }
}

TEST(HttpServer, AddressMustBeIpv4) {
  Server server("test metrics", "localhost", 0, nullptr);
  EXPECT_THROW(server.start(), InvalidArgument);
}

}  // namespace
}  // namespace longhaul::http
