// Stopping a thread's API writes promptly: a std::stop_token bound to the calling thread for a
// scope. The controller binds one to each reconcile worker for the time this replica leads;
// losing the Lease or a SIGTERM requests the stop.
//
// HttpClient checks the bound token before every attempt, while it waits for the rate limiter
// or for a retry, and it aborts a request in flight when the stop is requested; each of these
// throws longhaul::Cancelled naming the call. Code that writes through another Client (the
// reconciler, whatever its Client) calls throw_if_stop_requested() before each write. A request
// already received by the API server may still take effect: callers are idempotent.
//
// Threads with no bound token (informers, the leader elector) are never stopped this way.
//
// Thread-safety: the binding is thread-local; a std::stop_source may request the stop from any
// thread.
#pragma once

#include <stop_token>
#include <string_view>

namespace longhaul::kube {

// Binds `token` to the calling thread until destroyed (restores the previous binding).
class ScopedStopToken {
 public:
  explicit ScopedStopToken(std::stop_token token);
  ~ScopedStopToken();
  ScopedStopToken(const ScopedStopToken&) = delete;
  ScopedStopToken& operator=(const ScopedStopToken&) = delete;

 private:
  std::stop_token previous_;
};

// The token bound to the calling thread (a token that can never stop when none is bound).
const std::stop_token& current_stop_token();
bool stop_requested();
// Throws Cancelled("<what>: stopped (leadership lost or shutting down)") when requested.
void throw_if_stop_requested(std::string_view what);

}  // namespace longhaul::kube
