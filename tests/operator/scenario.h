// What the operator's scenario suites share, whichever API server they run against (the fake
// one of harness.h, or the real one of tests/envtest): the TrainingJob they create, the
// controller's options, waiting on a server's state with a deadline, and the check that a
// converged job's forced reconciles write nothing. Header-only; nothing here depends on the fake
// server.
//
// Thread-safety: used from the test thread; the reconcile counter it reads is atomic.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "longhaul/controller/controller.h"

namespace longhaul::testing {

// A TrainingJob named `name` of one Chief and `workers` Workers, both running `container` with
// a 5 s grace period, restartScope Group and no backoff between restarts. No namespace: the
// collection it is created in says it.
inline nlohmann::json training_job_manifest(const std::string& name, int workers,
                                            const nlohmann::json& container) {
  const nlohmann::json tmpl = {
      {"spec", {{"containers", {container}}, {"terminationGracePeriodSeconds", 5}}}};
  return {
      {"apiVersion", "longhaul.dev/v1alpha1"},
      {"kind", "TrainingJob"},
      {"metadata", {{"name", name}}},
      {"spec",
       {{"replicaSpecs",
         {{"Chief", {{"replicas", 1}, {"template", tmpl}}},
          {"Worker", {{"replicas", workers}, {"template", tmpl}}}}},
        {"runPolicy",
         {{"restartScope", "Group"}, {"backoff", {{"initialSeconds", 0}, {"maxSeconds", 0}}}}}}}};
}

// The controller of the scenario suites: two workers, 30 s watches, retries from 20 ms to
// 500 ms, and every reconcile counted in `reconciles`.
inline controller::ControllerOptions scenario_controller_options(std::atomic<int>& reconciles) {
  controller::ControllerOptions o;
  o.workers = 2;
  o.watch_timeout = std::chrono::seconds(30);
  o.retry_base_delay = std::chrono::milliseconds(20);
  o.retry_max_delay = std::chrono::milliseconds(500);
  o.on_reconcile = [&reconciles](std::string_view, double) { ++reconciles; };
  return o;
}

// Polls `condition`, which reads from an API server, every `poll` until it holds or `timeout`
// passes. An exception from it (the object is not there yet, a conflict) counts as "not yet";
// the last check runs unguarded, so a condition that can only throw reports why.
inline bool eventually_on_server(const std::function<bool()>& condition,
                                 std::chrono::milliseconds timeout,
                                 std::chrono::milliseconds poll) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    try {
      if (condition()) return true;
    } catch (const std::exception&) {
      // Not there yet: look again.
    }
    std::this_thread::sleep_for(poll);
  }
  return condition();
}

// Once a job has converged, reconciling it again must write nothing. Forces reconciles of `job`
// ("namespace/name") through `controller` one at a time, at most
// `max_rounds`, until `quiet_rounds` rounds in a row wrote nothing. `reconciles` is the count
// ControllerOptions::on_reconcile keeps; `take_writes` returns the operator's writes since its
// last call, one line each. Work still in flight from the last changes may write during the
// first round; a write in any later round fails the test, as does never reaching
// `quiet_rounds`. Failures name the job and list the writes. A reconcile that does not happen
// within a minute is a fatal failure: call it in ASSERT_NO_FATAL_FAILURE.
inline void expect_forced_reconciles_write_nothing(
    controller::Controller& controller, const std::atomic<int>& reconciles,
    const std::function<std::vector<std::string>()>& take_writes, const std::string& job,
    int max_rounds, int quiet_rounds) {
  using namespace std::chrono_literals;
  const auto listed = [](const std::vector<std::string>& writes) {
    std::string out;
    for (const std::string& w : writes) out += "  " + w + "\n";
    return out;
  };
  take_writes();  // what converging wrote is not this check's business
  int quiet = 0;
  std::vector<std::string> writes;
  for (int round = 0; round < max_rounds && quiet < quiet_rounds; ++round) {
    const int before = reconciles.load();
    controller.enqueue(job);
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (reconciles.load() <= before && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);  // a local counter: polled, the deadline bounds it
    }
    ASSERT_GT(reconciles.load(), before)
        << job << ": the forced reconcile of round " << round << " did not happen within 60 s";
    writes = take_writes();
    quiet = writes.empty() ? quiet + 1 : 0;
    if (!writes.empty() && round > 0) {
      ADD_FAILURE() << job << ": writes after convergence (round " << round << "):\n"
                    << listed(writes);
    }
  }
  EXPECT_EQ(quiet, quiet_rounds) << job << ": forced reconciles kept writing; the last round:\n"
                                 << listed(writes);
}

}  // namespace longhaul::testing
