#include "longhaul/supervisor/supervisor.h"

#include <chrono>
#include <thread>
#include <utility>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/base/log.h"
#include "longhaul/base/poll.h"

namespace longhaul::supervisor {
namespace {

bool is_clean(const std::exception_ptr& e) {
  if (!e) return true;
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.code() == Code::kOutOfRange || err.code() == Code::kCancelled;
  } catch (...) {
    return false;
  }
}

std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown exception";
  }
}

// What listeners are told about the checkpoint a session starts from. The commit time is the
// state file's timestamp for that file when it is listed there, else the file's mtime.
RestoredCheckpoint describe_restored(const CheckpointManager& manager,
                                     const std::filesystem::path& file, int64_t step) {
  RestoredCheckpoint r;
  r.step = step;
  r.file = file;
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (!ec) r.bytes = size;
  for (const CheckpointEntry& e : manager.checkpoints()) {
    if (e.file == file && e.timestamp > 0) r.wall_time = e.timestamp;
  }
  if (r.wall_time == 0) {
    const auto mtime = std::filesystem::last_write_time(file, ec);
    if (!ec) {
      const auto sys = std::chrono::file_clock::to_sys(mtime);
      r.wall_time = std::chrono::duration<double>(sys.time_since_epoch()).count();
    }
  }
  return r;
}

void check_secs(double v, const char* name) {
  if (!(v >= 0)) {
    throw InvalidArgument(std::string("supervisor option ") + name +
                          " must be >= 0 (0 disables), got " + std::to_string(v));
  }
}

}  // namespace

Supervisor::Supervisor(SupervisorOptions options) : options_(std::move(options)) {
  if (options_.logdir.empty()) throw InvalidArgument("supervisor option logdir must be set");
  if (options_.checkpoint_basename.empty()) {
    throw InvalidArgument("supervisor option checkpoint_basename must not be empty");
  }
  check_secs(options_.save_model_secs, "save_model_secs");
  check_secs(options_.save_summaries_secs, "save_summaries_secs");
  check_secs(options_.recovery_wait_secs, "recovery_wait_secs");
  check_secs(options_.stop_grace_secs, "stop_grace_secs");
  check_secs(options_.max_wait_secs, "max_wait_secs");
  check_secs(options_.keep_checkpoint_every_n_hours, "keep_checkpoint_every_n_hours");
  check_secs(options_.events_flush_secs, "events_flush_secs");
  check_secs(options_.lock_lease_secs, "lock_lease_secs");
  check_secs(options_.lock_heartbeat_secs, "lock_heartbeat_secs");
  if (options_.max_to_keep < 0) throw InvalidArgument("supervisor option max_to_keep must be >= 0");
  if (options_.is_chief) {
    // The lock first: the manager removes temp files, which may be another writer's.
    file::ensure_writable_directory(options_.logdir, "logdir");
    lease_ = LogdirLease::acquire(lease_options(), on_lease_lost(), options_.start_up_cancelled);
    try {
      make_manager();
    } catch (...) {
      lease_.reset();  // the destructor does not run for a constructor that throws
      throw;
    }
    // A marker from an earlier run must not tell non-chiefs the model is ready before this
    // chief has restored it.
    std::error_code ec;
    std::filesystem::remove(options_.logdir / kChiefReadyFile, ec);
  }
}

LeaseOptions Supervisor::lease_options() const {
  return LeaseOptions{options_.logdir / kWriterLockFile, options_.lock_lease_secs,
                      options_.lock_heartbeat_secs};
}

LogdirLease::LostCallback Supervisor::on_lease_lost() {
  // A loss (taken over after this process stopped renewing) stops the session with LeaseLost;
  // the fence keeps anything from being committed meanwhile.
  return [this](std::exception_ptr error) { coord_.request_stop(error); };
}

std::function<void()> Supervisor::fence() {
  LogdirLease* lease = lease_.get();
  return [lease] {
    if (lease != nullptr) lease->check_held();
  };
}

void Supervisor::make_manager() {
  CheckpointManagerOptions o{options_.logdir, options_.checkpoint_basename, options_.max_to_keep,
                             options_.keep_checkpoint_every_n_hours, /*remove_temp_files=*/true};
  o.fence = fence();
  manager_ = std::make_unique<CheckpointManager>(std::move(o));
}

std::optional<std::filesystem::path> Supervisor::commit_checkpoint_as_successor(
    TrainingState& state) {
  if (options_.is_chief) {
    throw FailedPrecondition("commit_checkpoint_as_successor is for non-chiefs");
  }
  if (!lease_) {
    LeaseWatch watch;  // one look: a holder that has not gone stale yet counts as alive
    try {
      lease_ = LogdirLease::try_acquire(lease_options(), on_lease_lost(), watch);
    } catch (const AlreadyExists& e) {
      LH_LOG(INFO) << "another process writes this logdir's checkpoints; not writing one"
                   << kv("why", e.what());
      return std::nullopt;
    }
    if (!lease_) {
      LH_LOG(INFO) << "another process holds this logdir's writer lock; not writing a checkpoint"
                   << kv("lock", lease_options().path.string());
      return std::nullopt;
    }
  }
  if (!manager_) make_manager();
  const int64_t step = state.global_step();
  for (const CheckpointEntry& e : manager_->checkpoints()) {
    if (e.step >= step) {
      LH_LOG(INFO) << "the logdir already holds a checkpoint at this step or later; not writing one"
                   << kv("step", step) << kv("checkpoint", e.file.string());
      return std::nullopt;
    }
  }
  Snapshot snapshot;
  state.snapshot(snapshot);
  const std::filesystem::path file = manager_->save(snapshot);
  LH_LOG(WARNING) << "committed a checkpoint in place of the lost chief" << kv("step", step)
                  << kv("path", file.string());
  return file;
}

void Supervisor::promote_to_chief(TrainingState& state, std::chrono::milliseconds lock_wait) {
  if (!in_session_.load() || state_ != &state) {
    throw FailedPrecondition("promote_to_chief is called inside managed_session, with its state");
  }
  if (options_.is_chief) throw FailedPrecondition("promote_to_chief called on the chief");
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + lock_wait;
  file::ensure_writable_directory(options_.logdir, "logdir");
  LeaseWatch watch;
  std::string held_by = "its holder has not let it go";
  while (!lease_) {
    try {
      lease_ = LogdirLease::try_acquire(lease_options(), on_lease_lost(), watch);
    } catch (const AlreadyExists& e) {
      held_by = e.what();
      watch = LeaseWatch{};  // it renewed: watch it afresh (it may freeze from now on)
    }
    if (lease_) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Aborted("cannot take over as chief: " + held_by +
                    ". The replica that was chief may still be alive (a network partition); "
                    "exit 138 so the whole group restarts");
    }
    // The lost chief's process may still be exiting; its flock goes with it. One that lives
    // on cut off (a partition) is taken over once its lease runs out.
    if (coord_.wait_for_stop(std::chrono::milliseconds(50))) {
      throw Cancelled("stop requested while taking over as chief");
    }
  }
  if (!manager_) make_manager();
  options_.is_chief = true;
  session_start_checkpoint_ = -1;
  std::optional<CheckpointEntry> latest;
  for (const CheckpointEntry& e : manager_->checkpoints()) {
    if (!latest || e.step > latest->step) latest = e;
  }
  if (latest) {
    session_start_checkpoint_ = latest->step;
    last_saved_step_.store(latest->step);
    const RestoredCheckpoint found = describe_restored(*manager_, latest->file, latest->step);
    for (auto* l : options_.checkpoint_listeners) l->on_chief_role_taken(found);
  }
  start_services(state);
  LH_LOG(WARNING)
      << "took over as chief: checkpoints and events are written here from now on"
      << kv("step", state.global_step()) << kv("events_file", events_file().string())
      << kv("latest_checkpoint_step", latest ? latest->step : int64_t{-1})
      << kv("seconds",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

Supervisor::~Supervisor() {
  // Threads that outlived a stop grace period may still touch the members below: wait for them
  // before anything is destroyed.
  coord_.request_stop();
  try {
    coord_.join(std::chrono::hours(24 * 365));
  } catch (...) {
    // Already reported by managed_session.
  }
  if (checkpointer_) checkpointer_->stop();
  {
    MutexLock lock(events_mu_);
    events_.reset();
  }
  lease_.reset();  // stops and joins the heartbeat, releases the flock
}

std::filesystem::path Supervisor::events_file() const {
  MutexLock lock(events_mu_);
  return events_ ? events_->path() : std::filesystem::path();
}

int64_t Supervisor::checkpoints_saved() const { return checkpointer_ ? checkpointer_->saves() : 0; }

void Supervisor::check_ready(const TrainingState& state, std::string_view how) {
  auto missing = options_.ready_check ? options_.ready_check(state) : state.uninitialized();
  if (missing.empty()) return;
  std::string names;
  for (const auto& m : missing) names += (names.empty() ? "" : ", ") + m;
  throw FailedPrecondition("model is not ready after " + std::string(how) + ": not initialised: " +
                           names + "; the init/restore code or init_fn must set them");
}

void Supervisor::prepare_chief(TrainingState& state) {
  if (options_.state_from_peers) {
    options_.state_from_peers(state);
    LH_LOG(INFO) << "took the state of the running replicas; no checkpoint read"
                 << kv("step", state.global_step());
    if (options_.local_init_fn) options_.local_init_fn(state);
    check_ready(state, "receiving the state from the running replicas");
    file::write_atomically(options_.logdir / kChiefReadyFile,
                           "step: " + std::to_string(state.global_step()) + "\n", fence());
    return;
  }
  std::vector<std::filesystem::path> skipped;
  auto reader = manager_->latest_valid(&skipped);
  if (reader) {
    check_compatible(state.tensor_specs(), *reader);
    state.restore(*reader);
    restored_step_ = state.global_step();
    last_saved_step_ = *restored_step_;
    session_start_checkpoint_ = *restored_step_;
    LH_LOG(INFO) << "restored checkpoint" << kv("path", reader->path())
                 << kv("step", *restored_step_);
    const RestoredCheckpoint restored =
        describe_restored(*manager_, reader->path(), *restored_step_);
    for (auto* l : options_.checkpoint_listeners) l->on_restored(restored);
  } else {
    if (!skipped.empty()) {
      std::string names;
      for (const auto& s : skipped) names += (names.empty() ? "" : ", ") + s.string();
      throw DataLoss("no checkpoint in " + options_.logdir.string() +
                     " can be restored; all are corrupt or truncated: " + names +
                     ". Move them away to start training from scratch");
    }
    state.initialize();
    if (options_.init_fn) options_.init_fn(state);
    LH_LOG(INFO) << "initialised model from scratch" << kv("logdir", options_.logdir.string())
                 << kv("init_fn", options_.init_fn ? "yes" : "no");
  }
  if (options_.local_init_fn) options_.local_init_fn(state);
  check_ready(state, reader ? "restoring " + reader->path() : std::string("initialisation"));
  file::write_atomically(options_.logdir / kChiefReadyFile,
                         "step: " + std::to_string(state.global_step()) + "\n", fence());
}

void Supervisor::prepare_non_chief(TrainingState& state) {
  if (options_.state_from_peers) {
    options_.state_from_peers(state);
    LH_LOG(INFO) << "took the state of the running replicas; no checkpoint read"
                 << kv("step", state.global_step());
    if (options_.local_init_fn) options_.local_init_fn(state);
    check_ready(state, "receiving the state from the running replicas");
    return;
  }
  using Clock = Coordinator::Clock;
  const auto start = Clock::now();
  const auto deadline = start + seconds(options_.max_wait_secs);
  auto last_log = start - std::chrono::hours(1);
  while (true) {
    std::error_code ec;
    if (std::filesystem::exists(options_.logdir / kCheckpointStateFile, ec) ||
        std::filesystem::exists(options_.logdir / kChiefReadyFile, ec)) {
      break;
    }
    auto now = Clock::now();
    if (now >= deadline) {
      throw DeadlineExceeded("the chief did not initialise the model in " +
                             options_.logdir.string() +
                             " within max_wait_secs=" + std::to_string(options_.max_wait_secs) +
                             " s; check that the chief replica is running and shares the logdir");
    }
    if (now - last_log >= std::chrono::seconds(30)) {
      LH_LOG(INFO) << "waiting for the chief to initialise the model"
                   << kv("logdir", options_.logdir.string());
      last_log = now;
    }
    // Looks again within tens of milliseconds at first (base/poll.h); recovery_wait_secs only
    // bounds the interval from above, as TensorFlow's poll interval did.
    const auto interval =
        std::min<Clock::duration>(poll_interval(now - start), seconds(options_.recovery_wait_secs));
    auto wait = std::min<Clock::duration>(deadline - now, interval);
    if (coord_.wait_for_stop(std::max(wait, Clock::duration(std::chrono::milliseconds(1))))) {
      throw Cancelled("stop requested while waiting for the chief");
    }
  }
  CheckpointManager reader_manager(CheckpointManagerOptions{
      options_.logdir, options_.checkpoint_basename, options_.max_to_keep,
      options_.keep_checkpoint_every_n_hours, /*remove_temp_files=*/false});
  auto reader = reader_manager.latest_valid();
  if (reader) {
    check_compatible(state.tensor_specs(), *reader);
    state.restore(*reader);
    restored_step_ = state.global_step();
    LH_LOG(INFO) << "restored checkpoint" << kv("path", reader->path())
                 << kv("step", *restored_step_);
    const RestoredCheckpoint restored =
        describe_restored(reader_manager, reader->path(), *restored_step_);
    for (auto* l : options_.checkpoint_listeners) l->on_restored(restored);
  } else {
    state.initialize();
  }
  if (options_.local_init_fn) options_.local_init_fn(state);
  check_ready(state, reader ? "restoring " + reader->path() : std::string("initialisation"));
}

void Supervisor::start_services(TrainingState& state) {
  if (options_.write_events) {
    auto writer = std::make_unique<EventsWriter>(
        options_.logdir, EventsWriter::Options{.flush_secs = options_.events_flush_secs});
    writer->add_session_log(tensorboard::SessionLog::START, state.global_step());
    writer->flush();
    MutexLock lock(events_mu_);
    events_ = std::move(writer);
  }
  checkpointer_ = std::make_unique<AsyncCheckpointer>(
      *manager_, &coord_, options_.checkpoint_listeners, [this](const CheckpointStats& st) {
        MutexLock lock(events_mu_);
        if (events_) {
          // An absolute path, as TensorFlow writes: not relative to wherever the worker runs.
          std::error_code ec;
          auto path = std::filesystem::absolute(st.file, ec);
          events_->add_session_log(tensorboard::SessionLog::CHECKPOINT, st.step,
                                   (ec ? st.file : path.lexically_normal()).string());
        }
      });
  if (options_.save_model_secs > 0 || options_.checkpoint_on_stop) {
    checkpointer_->preallocate(state.tensor_specs());
  }
  if (options_.save_model_secs > 0) {
    Looper::start(coord_, "checkpoint_service", seconds(options_.save_model_secs),
                  [this] { checkpoint_due_.fetch_or(kPeriodic, std::memory_order_relaxed); });
  }
  if (options_.save_summaries_secs > 0) {
    if (options_.summaries_enabled) {
      Looper::start(coord_, "summary_service", seconds(options_.save_summaries_secs), [this] {
        if (options_.summary_fn) options_.summary_fn(*this);
        // events_ is swapped out only after this thread is joined: flush without events_mu_ so
        // that add_scalar on the training thread never waits for the disk.
        EventsWriter* events = nullptr;
        {
          MutexLock lock(events_mu_);
          events = events_.get();
        }
        if (events) events->flush();
      });
    }
    if (options_.write_events) {
      struct Counter {
        int64_t step;
        Coordinator::Clock::time_point time;
      };
      auto last =
          std::make_shared<Counter>(Counter{state.global_step(), Coordinator::Clock::now()});
      Looper::start(coord_, "step_counter", seconds(options_.save_summaries_secs),
                    [this, &state, last] {
                      int64_t step = state.global_step();
                      auto now = Coordinator::Clock::now();
                      double dt = std::chrono::duration<double>(now - last->time).count();
                      if (dt > 0) add_scalar("global_step/sec", (step - last->step) / dt, step);
                      *last = Counter{step, now};
                    });
    }
  }
}

bool Supervisor::save_now(AsyncCheckpointer::Mode mode) {
  TrainingState* state = state_;
  return checkpointer_->request(
      [this, state](Snapshot& s) {
        s.step = state->global_step();
        state->snapshot(s);
        last_saved_step_.store(s.step);
      },
      mode);
}

void Supervisor::take_due_checkpoint(int64_t /*step*/) {
  int due = checkpoint_due_.load(std::memory_order_relaxed);
  if (!checkpointer_ || state_ == nullptr || !in_session_.load()) {
    checkpoint_due_.fetch_and(~due);
    return;
  }
  auto mode =
      (due & kForced) != 0 ? AsyncCheckpointer::Mode::kQueue : AsyncCheckpointer::Mode::kSkipIfBusy;
  // When skipped (a write in flight), the bits stay set and the next boundary tries again.
  if (save_now(mode)) checkpoint_due_.fetch_and(~due);
}

void Supervisor::loop(double interval_secs, std::function<void()> fn, std::string name) {
  if (!in_session_.load()) {
    throw FailedPrecondition("Supervisor::loop(" + name + ") called outside managed_session");
  }
  if (interval_secs <= 0) return;  // 0 disables, as for the services
  Looper::start(coord_, std::move(name), seconds(interval_secs), std::move(fn));
}

void Supervisor::summary_computed(const tensorboard::Summary& summary, int64_t step) {
  MutexLock lock(events_mu_);
  if (events_) events_->add_summary(summary, step);
}

void Supervisor::add_scalar(std::string_view tag, double value, int64_t step) {
  MutexLock lock(events_mu_);
  if (events_) events_->add_scalar(tag, value, step);
}

void Supervisor::add_text(std::string_view tag, std::string_view text, int64_t step) {
  MutexLock lock(events_mu_);
  if (events_) events_->add_text(tag, text, step);
}

void Supervisor::add_histogram(std::string_view tag, std::span<const float> values, int64_t step) {
  MutexLock lock(events_mu_);
  if (events_) events_->add_histogram(tag, values, step);
}

void Supervisor::managed_session(TrainingState& state,
                                 const std::function<void(Supervisor&)>& body) {
  if (in_session_.exchange(true)) {
    throw FailedPrecondition("managed_session is already running on this Supervisor");
  }
  struct SessionFlag {
    Supervisor* sv;
    ~SessionFlag() {
      sv->in_session_.store(false);
      sv->state_ = nullptr;
    }
  } flag{this};
  // A stop or checkpoint requested before the first session (a SIGTERM during start-up) is kept;
  // a later session starts from a clean slate.
  if (sessions_started_++ > 0) {
    coord_.clear_stop();
    checkpoint_due_.store(0);
  }
  restored_step_.reset();
  session_start_checkpoint_ = -1;
  state_ = &state;

  // 1-2. Restore or initialise; readiness. Nothing is running yet, errors propagate directly,
  // except a stop requested while a non-chief waits (clean: return).
  try {
    if (options_.is_chief) {
      prepare_chief(state);
    } else {
      prepare_non_chief(state);
    }
  } catch (const Cancelled&) {
    LH_LOG(INFO) << "stopped before the session started";
    return;
  }

  // 3-4. Services and body.
  std::exception_ptr body_error;
  try {
    if (options_.is_chief) start_services(state);
    body(*this);
  } catch (...) {
    body_error = std::current_exception();
    coord_.request_stop(body_error);
  }
  // 5. Final checkpoint on a clean end or a clean stop, on the training thread.
  finish_session(state, is_clean(body_error) && is_clean(coord_.error()));
  // A lost writer lock wins over everything: this process was taken over and must say so (the
  // worker exits 140), whatever else stopped the session.
  if (lease_ && lease_->lost()) {
    final_checkpoint_error_ = nullptr;
    lease_->check_held();  // throws the LeaseLost
  }
  // A final checkpoint that did not commit wins over a clean stop: the caller must not report
  // "committed" (the worker exits 138 instead of 143).
  if (final_checkpoint_error_) std::rethrow_exception(std::exchange(final_checkpoint_error_, {}));

  // 7. Re-raise after cleanup.
  std::exception_ptr error = coord_.error();
  if (!error && !is_clean(body_error)) error = body_error;
  if (error && !is_clean(error)) std::rethrow_exception(error);
  if (error || body_error) {
    LH_LOG(INFO) << "session stopped cleanly" << kv("reason", describe(error ? error : body_error));
  }
  auto stragglers = coord_.running_threads();
  if (!stragglers.empty()) {
    std::string names;
    for (const auto& n : stragglers) names += (names.empty() ? "" : ", ") + n;
    throw DeadlineExceeded("supervisor services did not stop within stop_grace_secs=" +
                           std::to_string(options_.stop_grace_secs) + " s: " + names);
  }
}

void Supervisor::finish_session(TrainingState& state, bool clean_end) {
  const bool lease_lost = lease_ && lease_->lost();
  if (lease_lost) clean_end = false;  // nothing more is written: no final checkpoint
  if (options_.is_chief && checkpointer_ && clean_end && options_.checkpoint_on_stop &&
      last_saved_step_.load() != state.global_step()) {
    try {
      save_now(AsyncCheckpointer::Mode::kQueue);
    } catch (...) {
      coord_.request_stop(std::current_exception());
    }
  }
  // 6. Stop and join the services, finish the writes, close the events file.
  coord_.request_stop();
  try {
    coord_.join(seconds(options_.stop_grace_secs));
  } catch (const std::exception& e) {
    // The error itself stays recorded in the coordinator (or shows as stragglers).
    LH_LOG(DEBUG) << "services joined with" << kv("error", e.what());
  }
  if (checkpointer_) {
    checkpointer_->stop();  // finishes the in-flight and final writes
    const auto committed = checkpointer_->last_stats();
    const int64_t committed_step = committed ? committed->step : session_start_checkpoint_;
    if (clean_end && options_.checkpoint_on_stop && committed_step != state.global_step()) {
      std::string why = "it was not written";
      if (auto error = checkpointer_->last_error()) why = describe(error);
      std::string latest = "none";
      if (auto file = manager_->latest()) latest = file->string();
      final_checkpoint_error_ = std::make_exception_ptr(Aborted(
          "the final checkpoint at step " + std::to_string(state.global_step()) +
          " was not committed: " + why + ". The logdir still names the latest committed " +
          "checkpoint (" + latest + "); a restart resumes from it. Free space in " +
          options_.logdir.string() + " (or lower checkpoint.max_to_keep) if the disk is full"));
      LH_LOG(ERROR) << "final checkpoint not committed" << kv("step", state.global_step())
                    << kv("latest_committed", latest);
    }
  }
  std::unique_ptr<EventsWriter> events;
  {
    MutexLock lock(events_mu_);
    events.swap(events_);
  }
  if (events && lease_ && lease_->lost()) {
    // The newer chief's events file carries on from its own START; no STOP from this one.
    LH_LOG(WARNING) << "writer lock lost: the events file ends without a SessionLog STOP"
                    << kv("file", events->path().string());
  } else if (events) {
    try {
      events->add_session_log(tensorboard::SessionLog::STOP, state.global_step());
      events->close();
    } catch (...) {
      coord_.request_stop(std::current_exception());
    }
  }
  LH_LOG(INFO) << "session ended" << kv("step", state.global_step())
               << kv("checkpoints_saved", checkpoints_saved());
}

}  // namespace longhaul::supervisor
