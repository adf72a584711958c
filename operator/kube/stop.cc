// Thread-bound stop tokens (see stop.h).
#include "longhaul/kube/stop.h"

#include <string>

#include "longhaul/base/error.h"

namespace longhaul::kube {

namespace {
thread_local std::stop_token bound_token;
}  // namespace

ScopedStopToken::ScopedStopToken(std::stop_token token) : previous_(std::move(bound_token)) {
  bound_token = std::move(token);
}

ScopedStopToken::~ScopedStopToken() { bound_token = std::move(previous_); }

const std::stop_token& current_stop_token() { return bound_token; }

bool stop_requested() { return bound_token.stop_requested(); }

void throw_if_stop_requested(std::string_view what) {
  if (bound_token.stop_requested()) {
    throw Cancelled(std::string(what) + ": stopped (leadership lost or shutting down)");
  }
}

}  // namespace longhaul::kube
