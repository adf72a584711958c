#include "longhaul/base/http_server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/testing/eventually.h"
#include "longhaul/testing/loopback.h"

namespace longhaul::http {
namespace {

using namespace std::chrono_literals;
using testing::eventually;
using testing::HeldConnections;

// The raw reply to GET <target>; "" when nothing listens.
std::string get(int port, const std::string& target) {
  return testing::http_get_raw(port, target, 10s);
}

Server metrics_server(ServerOptions options = {}) {
  return Server(
      "test metrics", "127.0.0.1", 0,
      [](std::string_view method, std::string_view path) {
        if (method == "GET" && path == "/metrics") return Response{200, "text/plain", "up 1\n"};
        if (path == "/boom") throw Internal("handler failed");
        return Response{404, "text/plain", "not found\n"};
      },
      options);
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

// A scrape as Prometheus makes it, bounded by Prometheus's own 10 s timeout (connect included):
// the body, or "" when the server did not answer in time.
std::string scrape_within_10s(int port) {
  const std::string reply = testing::http_get_raw(port, "/metrics", 10s);
  if (reply.rfind("HTTP/1.1 200 OK\r\n", 0) != 0) return "";
  return reply.substr(reply.find("\r\n\r\n") + 4);
}

// Regression (#23): 100 idle connections held open by another process made a scrape take 3.5 s,
// and with 200 a new connection was not even accepted: the server stopped accepting at 64
// connections and the rest waited in a listen backlog of 64. Now 500 held-open connections,
// some trickling a request header byte by byte, neither delay a scrape nor the stop.
TEST(HttpServer, FiveHundredHeldOpenConnectionsNeverTakeThePlaceOfAScrape) {
  testing::raise_open_files_limit();
  Server server = metrics_server();
  server.start();
  HeldConnections idle(server.port(), 500);
  HeldConnections trickling(server.port(), 20, "GET /metrics HTTP/1.1\r\n");
  ASSERT_EQ(idle.size(), 500u);
  // The slow clients send a byte every 50 ms until the server has closed all of them.
  std::atomic<bool> all_trickling_closed = false;
  std::jthread trickler([&](std::stop_token stop) {
    while (!stop.stop_requested() && !all_trickling_closed) {
      trickling.send_each("X");
      all_trickling_closed = trickling.closed_by_server() == trickling.size();
      std::this_thread::sleep_for(50ms);  // the pace of the slow client, not synchronisation
    }
  });
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(scrape_within_10s(server.port()), "up 1\n") << "scrape " << i;
  }
  // They are closed at their header deadline, however steadily they send.
  EXPECT_TRUE(eventually([&] { return all_trickling_closed.load(); }, 30s));
  trickler.request_stop();
  trickler.join();
  // stop() returns with the held connections still open, and closes them.
  auto stopped = std::async(std::launch::async, [&] { server.stop(); });
  ASSERT_EQ(stopped.wait_for(30s), std::future_status::ready) << "stop() did not return";
  EXPECT_EQ(idle.closed_by_server(), 500u);
}

// At the bound on open connections, a new one evicts the oldest that has not sent a request:
// the scrape is answered and the held connections are the ones closed.
TEST(HttpServer, AtTheConnectionBoundTheOldestIdleConnectionMakesRoom) {
  Server server = metrics_server({.max_connections = 8});
  server.start();
  EXPECT_EQ(server.max_connections(), 8u);
  HeldConnections idle(server.port(), 50);
  EXPECT_EQ(scrape_within_10s(server.port()), "up 1\n");
  // All but the newest few are closed to make room (the scrape's own slot included).
  EXPECT_TRUE(eventually([&] { return idle.closed_by_server() >= 50 - 8; }, 30s))
      << idle.closed_by_server() << " of 50 closed";
}

// A client that connects and says nothing, or stops in the middle of its header, is closed at
// the header deadline (it does not hold a descriptor for the whole request deadline).
TEST(HttpServer, SilentAndHalfRequestClientsAreClosedAtTheHeaderDeadline) {
  Server server = metrics_server({.header_timeout = 100ms, .request_timeout = 60s});
  server.start();
  HeldConnections silent(server.port(), 5);
  HeldConnections half(server.port(), 5, "GET /metrics HTTP/1.1\r\nHost: x\r\n");
  EXPECT_TRUE(eventually([&] { return silent.closed_by_server() == 5; }, 30s));
  EXPECT_TRUE(eventually([&] { return half.closed_by_server() == 5; }, 30s));
  EXPECT_EQ(scrape_within_10s(server.port()), "up 1\n");
}

TEST(HttpServer, DefaultConnectionBoundFollowsTheOpenFilesLimit) {
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  Server server = metrics_server();
  EXPECT_GE(server.max_connections(), 16u);
  EXPECT_LE(server.max_connections(), 1024u);
  if (limit.rlim_cur != RLIM_INFINITY) {
    EXPECT_LE(server.max_connections(), std::max<rlim_t>(limit.rlim_cur / 4, 16));
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
