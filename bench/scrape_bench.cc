// Scrape benchmark: how long a Prometheus scrape of a longhaul metrics endpoint takes while
// other clients hold connections to it open without sending a request (#23). Every endpoint of
// the project is this server (base/http_server.h): the worker's --metrics-port, the operator's
// /metrics and its /healthz and /readyz probes.
//
//   cmake --build build/ci --target scrape_bench
//   build/ci/bench/scrape_bench [--idle 0,100,200,500,1000] [--scrapes 20] [--body-kb 64]
//
// For each N of --idle: a server with the default options serving a --body-kb body on /metrics;
// N connections opened (non-blocking connect) and held, sending nothing; then --scrapes scrapes
// one after another (connect, GET /metrics, read to the end of the reply), each abandoned after
// 10 s as Prometheus would. Reports the median and slowest scrape, scrapes that failed, the held
// connections the server had closed by the end of the scrapes, and how long stop() takes with
// the held connections still open. Prints one table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "longhaul/base/http_server.h"
#include "longhaul/testing/loopback.h"

namespace http = longhaul::http;
namespace testing = longhaul::testing;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// One scrape with Prometheus's 10 s timeout; the length of the body, or -1.
long scrape(int port) {
  const std::string reply = testing::http_get_raw(port, "/metrics", std::chrono::seconds(10));
  if (reply.rfind("HTTP/1.1 200", 0) != 0) return -1;
  return static_cast<long>(reply.size() - reply.find("\r\n\r\n") - 4);
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    out.push_back(std::stoi(s.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> idle_counts = {0, 100, 200, 500, 1000};
  int scrapes = 20;
  size_t body_kb = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || i + 1 >= argc) {
      std::printf(
          "usage: scrape_bench [--idle 0,100,200,500,1000] [--scrapes 20] [--body-kb 64]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
    const std::string v = argv[++i];
    if (a == "--idle") {
      idle_counts = parse_list(v);
    } else if (a == "--scrapes") {
      scrapes = std::stoi(v);
    } else if (a == "--body-kb") {
      body_kb = std::stoul(v);
    } else {
      std::fprintf(stderr, "unknown flag %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  const uint64_t open_files = testing::raise_open_files_limit();
  const std::string body(body_kb << 10, 'm');
  http::Server probe("bench metrics", "127.0.0.1", 0, nullptr);
  std::printf(
      "scrape_bench: %d scrapes per row, %zu KiB body, open-files limit %llu, "
      "connection bound %zu\n\n",
      scrapes, body_kb, static_cast<unsigned long long>(open_files), probe.max_connections());
  std::printf("| %10s | %14s | %14s | %6s | %14s | %8s |\n", "held conns", "scrape p50 ms",
              "scrape max ms", "failed", "held closed", "stop ms");
  std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(12, '-').c_str(), std::string(16, '-').c_str(),
              std::string(16, '-').c_str(), std::string(8, '-').c_str(),
              std::string(16, '-').c_str(), std::string(10, '-').c_str());
  for (int idle : idle_counts) {
    http::Server server("bench metrics", "127.0.0.1", 0,
                        [&](std::string_view, std::string_view path) {
                          if (path != "/metrics") return http::Response{404, "text/plain", ""};
                          return http::Response{200, "text/plain; version=0.0.4", body};
                        });
    server.start();
    testing::HeldConnections held(server.port(), idle);
    std::vector<double> latencies;
    int failed = 0;
    for (int i = 0; i < scrapes; ++i) {
      const auto t0 = Clock::now();
      const long got = scrape(server.port());
      latencies.push_back(ms_since(t0));
      if (got != static_cast<long>(body.size())) ++failed;
    }
    const size_t closed = held.closed_by_server();
    const auto t0 = Clock::now();
    server.stop();
    const double stop_ms = ms_since(t0);
    std::sort(latencies.begin(), latencies.end());
    std::printf("| %10zu | %14.2f | %14.2f | %6d | %14zu | %8.2f |\n", held.size(),
                latencies[latencies.size() / 2], latencies.back(), failed, closed, stop_ms);
  }
  return 0;
}
