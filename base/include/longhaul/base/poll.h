// How long to sleep before looking again for something another process writes to a shared
// folder (a rendezvous file, the chief's model): the replicas' waits are polls, because a shared
// logdir may be a network filesystem where change notifications from other hosts never arrive.
//
// The interval is a tenth of the time waited so far, between 10 ms and 250 ms: a wait that ends
// quickly (the usual start-up and regroup) reacts within tens of milliseconds, and a long one
// (a peer that takes minutes to come) costs at most four looks a second — about 45 looks in the
// first 2.5 s, then 4 per second. Thread-safe (a pure function).
#pragma once

#include <algorithm>
#include <chrono>

namespace longhaul {

inline constexpr std::chrono::milliseconds kMinPollInterval{10};
inline constexpr std::chrono::milliseconds kMaxPollInterval{250};

// The sleep before the next look, after waiting `waited` so far.
inline std::chrono::milliseconds poll_interval(std::chrono::steady_clock::duration waited) {
  const auto tenth = std::chrono::duration_cast<std::chrono::milliseconds>(waited) / 10;
  return std::clamp(tenth, kMinPollInterval, kMaxPollInterval);
}

}  // namespace longhaul
