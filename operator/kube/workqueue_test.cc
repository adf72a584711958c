// Work queue: de-duplication, in-process exclusivity, delays, per-key backoff, shutdown.
#include "longhaul/kube/workqueue.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_http_server.h"

namespace longhaul::kube {
namespace {

using namespace std::chrono_literals;
using testing::wait_until;

TEST(WorkQueueTest, DuplicateAddsAreCollapsed) {
  WorkQueue queue;
  queue.add("ns/a");
  queue.add("ns/a");
  queue.add("ns/b");
  EXPECT_EQ(queue.depth(), 2u);
  EXPECT_EQ(queue.get(), "ns/a");
  EXPECT_EQ(queue.get(), "ns/b");
  EXPECT_FALSE(queue.get_for(10ms));
}

TEST(WorkQueueTest, KeyAddedWhileProcessingIsRequeuedAfterDone) {
  WorkQueue queue;
  queue.add("ns/a");
  ASSERT_EQ(queue.get(), "ns/a");
  queue.add("ns/a");  // changed while a worker reconciles it
  queue.add("ns/a");
  EXPECT_EQ(queue.depth(), 0u);  // not handed to a second worker
  EXPECT_FALSE(queue.get_for(10ms));
  queue.done("ns/a");
  EXPECT_EQ(queue.depth(), 1u);
  EXPECT_EQ(queue.get(), "ns/a");
  queue.done("ns/a");
  EXPECT_FALSE(queue.get_for(10ms));
}

TEST(WorkQueueTest, ManyWorkersNeverShareAKey) {
  WorkQueue queue;
  std::mutex mu;
  std::set<std::string> in_process;
  std::atomic<bool> overlap{false};
  std::atomic<int> processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      while (auto key = queue.get()) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!in_process.insert(*key).second) overlap = true;
        }
        std::this_thread::yield();
        {
          std::lock_guard<std::mutex> lock(mu);
          in_process.erase(*key);
        }
        processed.fetch_add(1);
        queue.done(*key);
      }
    });
  }
  for (int round = 0; round < 200; ++round) queue.add("ns/k" + std::to_string(round % 5));
  EXPECT_TRUE(wait_until([&] { return queue.depth() == 0 && processed.load() >= 5; }));
  queue.shutdown();
  for (auto& t : workers) t.join();
  EXPECT_FALSE(overlap.load());
}

TEST(WorkQueueTest, AddAfterDelaysTheKey) {
  WorkQueue queue;
  const auto start = WorkQueue::Clock::now();
  queue.add_after("ns/a", 50ms);
  queue.add_after("ns/a", 500ms);  // a later time does not postpone it
  EXPECT_FALSE(queue.get_for(5ms));
  EXPECT_EQ(queue.get(), "ns/a");
  const auto waited = WorkQueue::Clock::now() - start;
  EXPECT_GE(waited, 50ms);
  EXPECT_LT(waited, 450ms);
}

TEST(WorkQueueTest, RateLimitedBackoffDoublesPerKeyUntilForgotten) {
  WorkQueueOptions options;
  options.base_delay = 20ms;
  options.max_delay = 60ms;
  WorkQueue queue(options);
  std::vector<WorkQueue::Clock::duration> waits;
  for (int i = 0; i < 4; ++i) {
    const auto start = WorkQueue::Clock::now();
    queue.add_rate_limited("ns/a");
    ASSERT_EQ(queue.get(), "ns/a");
    waits.push_back(WorkQueue::Clock::now() - start);
    queue.done("ns/a");
  }
  EXPECT_EQ(queue.num_requeues("ns/a"), 4);
  EXPECT_GE(waits[0], 20ms);
  EXPECT_GE(waits[1], 40ms);
  EXPECT_GE(waits[2], 60ms);  // capped at max_delay from here on
  EXPECT_GE(waits[3], 60ms);
  EXPECT_LT(waits[3], 160ms);
  queue.forget("ns/a");
  EXPECT_EQ(queue.num_requeues("ns/a"), 0);
  EXPECT_EQ(queue.num_requeues("ns/other"), 0);
}

TEST(WorkQueueTest, ShutdownWakesEveryGetter) {
  WorkQueue queue;
  std::atomic<int> returned{0};
  std::vector<std::thread> getters;
  for (int i = 0; i < 3; ++i) {
    getters.emplace_back([&] {
      EXPECT_FALSE(queue.get());
      returned.fetch_add(1);
    });
  }
  EXPECT_FALSE(wait_until([&] { return returned.load() > 0; }, 20ms));
  queue.shutdown();
  EXPECT_TRUE(wait_until([&] { return returned.load() == 3; }));
  for (auto& t : getters) t.join();
  queue.add("ns/a");  // ignored after shutdown
  EXPECT_FALSE(queue.get_for(1ms));
}

TEST(WorkQueueTest, ReportsDepthAndLatency) {
  std::vector<size_t> depths;
  std::vector<double> latencies;
  WorkQueueOptions options;
  options.on_depth = [&](size_t d) { depths.push_back(d); };
  options.on_latency = [&](double s) { latencies.push_back(s); };
  WorkQueue queue(options);
  queue.add("ns/a");
  queue.add("ns/b");
  queue.get();
  EXPECT_EQ(depths, (std::vector<size_t>{1, 2, 1}));
  ASSERT_EQ(latencies.size(), 1u);
  EXPECT_GE(latencies[0], 0.0);
}

}  // namespace
}  // namespace longhaul::kube
