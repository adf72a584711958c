// DataParallel: state broadcast, gradient averaging (overlapped bucketed all-reduce on CPU),
// stop agreement. See data_parallel.h.
#include "longhaul/distributed/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/distributed/nccl.h"

namespace longhaul::dist {
namespace {

using json = nlohmann::json;

// A TensorSource over a Snapshot held in memory (the chief's state as received).
class SnapshotSource : public supervisor::TensorSource {
 public:
  explicit SnapshotSource(const supervisor::Snapshot& snap) : snap_(snap) {
    for (const auto& spec : snap_.specs) names_.push_back(spec.name);
  }
  const std::string& path() const override { return path_; }
  bool contains(std::string_view name) const override { return index(name) >= 0; }
  std::vector<std::string> tensor_names() const override { return names_; }
  const supervisor::TensorSpec& spec(std::string_view name) const override {
    return snap_.specs[static_cast<size_t>(must(name))];
  }
  std::span<const std::byte> data(std::string_view name) const override {
    return snap_.buffers[static_cast<size_t>(must(name))];
  }
  const std::map<std::string, std::string>& metadata() const override { return snap_.metadata; }

 private:
  int index(std::string_view name) const {
    for (size_t i = 0; i < snap_.specs.size(); ++i) {
      if (snap_.specs[i].name == name) return static_cast<int>(i);
    }
    return -1;
  }
  int must(std::string_view name) const {
    int i = index(name);
    if (i < 0) throw NotFound("tensor " + std::string(name) + " is not in " + path_);
    return i;
  }
  const supervisor::Snapshot& snap_;
  std::vector<std::string> names_;
  std::string path_ = "<state broadcast from rank 0>";
};

json specs_json(const std::vector<supervisor::TensorSpec>& specs) {
  json out = json::array();
  for (const auto& s : specs) {
    out.push_back({s.name, std::string(supervisor::dtype_name(s.dtype)), s.shape});
  }
  return out;
}

void broadcast_string(Communicator& comm, std::string& text, std::chrono::milliseconds timeout,
                      int root) {
  int64_t size = static_cast<int64_t>(text.size());
  comm.broadcast(std::as_writable_bytes(std::span<int64_t>(&size, 1)), root, timeout);
  text.resize(static_cast<size_t>(size));
  comm.broadcast(std::as_writable_bytes(std::span<char>(text.data(), text.size())), root);
}

// The tensors of a snapshot from `root` to every rank, packed into chunks of up to kChunkBytes
// (one collective per chunk rather than per tensor: a model has hundreds of small tensors, and
// each collective costs a round trip, which a busy machine makes milliseconds). A tensor larger
// than a chunk travels alone, in place.
void broadcast_tensors(Communicator& comm, std::vector<std::vector<std::byte>>& buffers, int root) {
  constexpr size_t kChunkBytes = size_t{64} << 20;
  std::vector<std::byte> chunk;
  for (size_t first = 0; first < buffers.size();) {
    size_t end = first + 1, bytes = buffers[first].size();
    while (end < buffers.size() && bytes + buffers[end].size() <= kChunkBytes) {
      bytes += buffers[end++].size();
    }
    if (end == first + 1) {
      comm.broadcast(buffers[first], root);
      first = end;
      continue;
    }
    chunk.resize(bytes);
    if (comm.rank() == root) {
      size_t at = 0;
      for (size_t i = first; i < end; ++i) {
        std::memcpy(chunk.data() + at, buffers[i].data(), buffers[i].size());
        at += buffers[i].size();
      }
    }
    comm.broadcast(chunk, root);
    if (comm.rank() != root) {
      size_t at = 0;
      for (size_t i = first; i < end; ++i) {
        std::memcpy(buffers[i].data(), chunk.data() + at, buffers[i].size());
        at += buffers[i].size();
      }
    }
    first = end;
  }
}

std::string rank_names(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

DataParallel::DataParallel(std::unique_ptr<Communicator> comm, DataParallelOptions options,
                           std::unique_ptr<DeviceAllreduce> device)
    : comm_(std::move(comm)), options_(options), device_(std::move(device)) {
  if (!comm_) throw InvalidArgument("DataParallel needs a communicator");
  rank_ = comm_->rank();
  world_size_ = comm_->world_size();
  if (const char* v = std::getenv("LONGHAUL_TEST_KILL_MID_ALLREDUCE"); v != nullptr && *v) {
    kill_mid_allreduce_at_ = std::strtoll(v, nullptr, 10);
  }
}

DataParallel::~DataParallel() { stop_communication_thread(); }

void DataParallel::broadcast_state(supervisor::TrainingState& state,
                                   std::chrono::milliseconds timeout, int root) {
  if (world_size() == 1) return;
  quiesce();
  stop_here_for_test("sync");
  const auto start = std::chrono::steady_clock::now();
  supervisor::Snapshot snap;
  const auto my_specs = state.tensor_specs();
  std::string header;
  if (rank() == root) {
    state.snapshot(snap);
    header =
        json{{"step", snap.step}, {"metadata", snap.metadata}, {"specs", specs_json(snap.specs)}}
            .dump();
  }
  broadcast_string(group(), header, timeout, root);
  json parsed = json::parse(header);
  // Every rank learns whether some replica runs another model config, so the whole group exits
  // with the usage code (a restart cannot fix it) instead of the chief seeing a lost peer.
  std::string mismatch;
  if (rank() != root) {
    const json theirs = parsed["specs"];
    const json mine = specs_json(my_specs);
    for (size_t i = 0; i < std::max(theirs.size(), mine.size()); ++i) {
      const json a = i < theirs.size() ? theirs[i] : json();
      const json b = i < mine.size() ? mine[i] : json();
      if (a != b) {
        mismatch = "rank " + std::to_string(rank()) + " cannot take rank " + std::to_string(root) +
                   "'s state: tensor " + std::to_string(i) + " is " + a.dump() + " there but " +
                   b.dump() + " here. Every replica must run the same model config";
        break;
      }
    }
  }
  int64_t worst = mismatch.empty() ? 0 : rank() + 1;
  group().allreduce_max(std::span<int64_t>(&worst, 1));
  if (!mismatch.empty()) throw InvalidArgument(mismatch);
  if (worst != 0) {
    throw InvalidArgument("rank " + std::to_string(worst - 1) +
                          " runs another model config than rank " + std::to_string(root) +
                          " (its log names the first differing tensor). Every replica must run "
                          "the same model config");
  }
  if (rank() != root) {
    snap.reshape(my_specs);
    snap.step = parsed["step"].get<int64_t>();
    snap.metadata = parsed["metadata"].get<std::map<std::string, std::string>>();
  }
  broadcast_tensors(group(), snap.buffers, root);
  if (rank() != root) {
    SnapshotSource source(snap);
    state.restore(source);
  }
  LH_LOG(INFO)
      << "replicas synchronised" << kv("rank", rank()) << kv("from_rank", root)
      << kv("step", snap.step) << kv("tensors", snap.buffers.size())
      << kv("seconds",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

bool DataParallel::overlaps(const model::LanguageModel& model) const {
  return options_.overlap_allreduce && model.memory_space() == model::MemorySpace::kHost &&
         model.reports_gradients_per_layer();
}

size_t DataParallel::bucket_limit(size_t elements) const {
  const size_t bytes =
      options_.bucket_bytes > 0
          ? options_.bucket_bytes
          : std::min(DataParallelOptions::kDefaultBucketBytes, elements * sizeof(float) / 4);
  return std::max<size_t>(1, bytes / sizeof(float));
}

void DataParallel::check_gradient_plan(model::LanguageModel& model) {
  if (plan_checked_) return;
  plan_checked_ = true;
  // Every rank's first gradient collective, whichever path it takes: ranks that would issue
  // different buckets (overlap on here and off there, another bucket size or model) must not
  // start, or their all-reduces would pair up wrongly.
  const int64_t overlap = overlaps(model) ? 1 : 0;
  const auto n = static_cast<int64_t>(model.gradients_flat().size());
  const int64_t limit = overlap ? static_cast<int64_t>(bucket_limit(static_cast<size_t>(n))) : 0;
  std::vector<int64_t> plan{overlap, -overlap, limit, -limit, n, -n};
  quiesce();
  group().allreduce_max(plan);
  if (plan[0] != -plan[1] || plan[2] != -plan[3] || plan[4] != -plan[5]) {
    throw InvalidArgument(
        "rank " + std::to_string(rank()) + " would all-reduce gradients differently from " +
        "other replicas (here: overlap " + (overlap ? "on" : "off") + ", buckets of " +
        std::to_string(limit) + " floats, " + std::to_string(n) +
        " gradients): give every replica the same --allreduce-overlap / "
        "LONGHAUL_ALLREDUCE_OVERLAP, --allreduce-bucket-mb / LONGHAUL_ALLREDUCE_BUCKET_MB and "
        "model config");
  }
}

void DataParallel::start_gradient_averaging(model::LanguageModel& model) {
  if (world_size() == 1) return;
  check_gradient_plan(model);
  if (!overlaps(model)) return;
  quiesce();  // nothing is in flight between steps; this also forgets an unfinished step
  const std::span<float> grads = model.gradients_flat();
  overlap_model_ = &model;
  overlap_grads_ = grads;
  bucket_limit_ = bucket_limit(grads.size());
  pending_ = {};
  reported_.clear();
  reported_elements_ = 0;
  last_bucket_count_ = 0;
  contract_error_ = nullptr;
  {
    MutexLock lock(mu_);
    queue_base_ = grads.data();
    queue_scale_ = 1.0f / static_cast<float>(world_size());
    stop_ = false;
    kill_after_bucket_ =
        kill_mid_allreduce_at_ > 0 && averaged_steps_ + 1 == kill_mid_allreduce_at_;
  }
  if (!comm_thread_.joinable()) comm_thread_ = std::thread([this] { communication_loop(); });
  model.set_gradient_ready_callback(
      [this](size_t begin, size_t end) { on_gradients_ready(begin, end); });
}

void DataParallel::on_gradients_ready(size_t begin, size_t end) {
  if (overlap_model_ == nullptr || contract_error_) return;  // a stale callback, or already bad
  const size_t n = overlap_grads_.size();
  std::string problem;
  if (begin >= end || end > n) {
    problem = "an empty or out-of-bounds range";
  } else {
    for (const Span& r : reported_) {
      if (begin < r.end && r.begin < end) {
        problem = "a range overlapping [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                  ") reported before";
        break;
      }
    }
  }
  if (!problem.empty()) {
    contract_error_ = std::make_exception_ptr(
        Internal("the " + std::string(overlap_model_->device_name()) +
                 " model reported gradients [" + std::to_string(begin) + ", " +
                 std::to_string(end) + ") of " + std::to_string(n) + " as ready: " + problem +
                 ". This breaks the gradient-ready contract of "
                 "language_model.h (a backend bug); train with --allreduce-overlap off meanwhile"));
    return;
  }
  reported_.push_back({begin, end});
  reported_elements_ += end - begin;
  // Adjacent ranges grow the pending bucket; a range elsewhere closes it first.
  if (pending_.begin == pending_.end) {
    pending_ = {begin, end};
  } else if (end == pending_.begin) {
    pending_.begin = begin;
  } else if (begin == pending_.end) {
    pending_.end = end;
  } else {
    issue_bucket(pending_);
    pending_ = {begin, end};
  }
  if (pending_.end - pending_.begin >= bucket_limit_) {
    issue_bucket(pending_);
    pending_ = {};
  }
}

void DataParallel::issue_bucket(Span bucket) {
  {
    MutexLock lock(mu_);
    queue_.push_back(bucket);
    ++issued_buckets_;
  }
  ++last_bucket_count_;
  work_cv_.notify_one();
}

void DataParallel::communication_loop() {
  MutexLock lock(mu_);
  while (true) {
    work_cv_.wait(mu_, [this]() REQUIRES(mu_) { return stop_ || !queue_.empty(); });
    if (stop_) return;  // buckets still queued are abandoned (stop_communication_thread)
    const Span bucket = queue_.front();
    queue_.pop_front();
    float* const data = queue_base_ + bucket.begin;
    const size_t count = bucket.end - bucket.begin;
    const float scale = queue_scale_;
    const bool failed = comm_error_ != nullptr;
    lock.Unlock();
    std::exception_ptr error;
    double seconds = 0;
    if (!failed) {  // after a failure the group is unusable: the rest are skipped
      const auto start = std::chrono::steady_clock::now();
      try {
        comm_->allreduce_sum(std::span<float>(data, count));
        for (size_t i = 0; i < count; ++i) data[i] *= scale;
      } catch (...) {
        error = std::current_exception();
      }
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    lock.Lock();
    if (kill_after_bucket_ && !error && !failed) {
      // Test-only fault injection (data_parallel.h): die between two buckets of a step, while
      // the peers are inside the next all-reduce with this replica.
      LH_LOG(WARNING) << "LONGHAUL_TEST_KILL_MID_ALLREDUCE: killing this replica mid-all-reduce"
                      << kv("rank", rank_);
      ::kill(::getpid(), SIGKILL);
    }
    busy_seconds_ += seconds;
    if (error && !comm_error_) comm_error_ = error;
    ++completed_buckets_;
    done_cv_.notify_all();
  }
}

std::exception_ptr DataParallel::wait_for_buckets() {
  MutexLock lock(mu_);
  // Each bucket's all-reduce ends within the collective timeout (or throws), so this is bounded.
  done_cv_.wait(mu_, [this]() REQUIRES(mu_) { return completed_buckets_ == issued_buckets_; });
  std::exception_ptr error = comm_error_;
  comm_error_ = nullptr;
  return error;
}

void DataParallel::stop_communication_thread() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (comm_thread_.joinable()) comm_thread_.join();
  MutexLock lock(mu_);
  queue_.clear();
  completed_buckets_ = issued_buckets_;
}

void DataParallel::quiesce() {
  if (overlap_model_ != nullptr) {
    // Started but never finished (forward_backward threw): later callbacks are ignored.
    overlap_model_ = nullptr;
    pending_ = {};
  }
  if (std::exception_ptr error = wait_for_buckets()) {
    stop_communication_thread();
    std::rethrow_exception(error);
  }
}

void DataParallel::average_gradients(model::LanguageModel& model) {
  if (world_size() == 1) return;
  check_gradient_plan(model);
  const auto start = std::chrono::steady_clock::now();
  if (overlap_model_ == &model) {
    model.set_gradient_ready_callback({});
    overlap_model_ = nullptr;
    if (!contract_error_ && pending_.begin != pending_.end) issue_bucket(pending_);
    pending_ = {};
    if (std::exception_ptr error = wait_for_buckets()) {
      stop_communication_thread();  // joined before the error reaches the training loop
      std::rethrow_exception(error);
    }
    if (contract_error_) std::rethrow_exception(contract_error_);
    if (reported_elements_ != overlap_grads_.size()) {
      throw Internal("the " + std::string(model.device_name()) + " model reported " +
                     std::to_string(reported_elements_) + " of " +
                     std::to_string(overlap_grads_.size()) +
                     " gradient elements as ready during its backward pass; the gradient-ready "
                     "contract of language_model.h needs all of them (a backend bug); train "
                     "with --allreduce-overlap off meanwhile");
    }
  } else {
    last_bucket_count_ = 0;
    allreduce_whole(model);
  }
  ++averaged_steps_;
  allreduce_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void DataParallel::allreduce_whole(model::LanguageModel& model) {
  quiesce();
  const auto start = std::chrono::steady_clock::now();
  std::span<float> grads = model.gradients_flat();
  if (model.memory_space() == model::MemorySpace::kHost) {
    group().allreduce_sum(grads);
    const float scale = 1.0f / static_cast<float>(world_size());
    for (float& g : grads) g *= scale;
  } else {
    // A device model: its all-reduce is made at the first step of each group on the training
    // thread (whose current device is the model's), over this group's communicator.
    if (!device_) {
      device_ = make_device_allreduce(model);
      ++device_allreduces_made_;
    }
    try {
      device_->allreduce_mean(grads.data(), grads.size());  // ncclAvg: already the mean
    } catch (const Aborted&) {
      device_.reset();  // aborted (ncclCommAbort): unusable, like the group it was made for
      throw;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MutexLock lock(mu_);
  busy_seconds_ += seconds;
}

std::unique_ptr<DeviceAllreduce> DataParallel::make_device_allreduce(
    const model::LanguageModel& model) {
  if (options_.make_device_allreduce) return options_.make_device_allreduce(group());
  if (!nccl_available()) {
    throw FailedPrecondition("the " + std::string(model.device_name()) +
                             " model needs NCCL for gradient all-reduce, and this build has no "
                             "NCCL; train on CPU or build with CUDA and NCCL");
  }
  auto device = make_nccl_allreduce(group(), -1, options_.device_timeout);
  verify_device_allreduce(*device, rank(), world_size());  // selfcheck: before any update
  return device;
}

Communicator& DataParallel::group() {
  if (!comm_) {
    throw PeerLost("rank " + std::to_string(rank()) +
                   ": the data-parallel group is gone (the last regroup did not complete)");
  }
  return *comm_;
}

double DataParallel::allreduce_busy_seconds() const {
  MutexLock lock(mu_);
  return busy_seconds_;
}

bool DataParallel::any_stop(bool local_stop) {
  if (world_size() == 1) return local_stop;
  quiesce();
  std::vector<int64_t> flags(static_cast<size_t>(world_size()), 0);
  flags[static_cast<size_t>(rank())] = local_stop ? 1 : 0;
  group().allreduce_max(flags);
  std::vector<int> leaving;
  for (int r = 0; r < world_size(); ++r) {
    if (flags[static_cast<size_t>(r)] != 0) leaving.push_back(r);
  }
  if (leaving.empty()) return false;
  const bool everyone = static_cast<int>(leaving.size()) == world_size();
  if (local_stop || everyone || !regroup_enabled_) {
    if (!local_stop) stop_by_peer_ = true;
    return true;
  }
  // Some replicas leave (a preemption notice): the others regroup at once.
  throw PeerLost("rank(s) " + rank_names(leaving) +
                 " left the data-parallel group (a stop was requested there, e.g. a preemption "
                 "SIGTERM) at step boundary; regrouping without them");
}

StateSource DataParallel::agree_state_source(std::optional<int64_t> completed_step) {
  StateSource source;
  if (world_size() == 1) {
    source.step = completed_step.value_or(-1);
    source.survivors = completed_step.has_value();
    chief_ = 0;
    return source;
  }
  quiesce();
  // world_size steps, then the recovery policy twice (max and -min): replicas that disagree
  // on supervisor.on_peer_loss would issue different collectives after a loss; then one chief
  // claim per rank (1 on the replica that holds the role and kept its state).
  const auto w = static_cast<size_t>(world_size());
  std::vector<int64_t> votes(2 * w + 2, -2);
  votes[static_cast<size_t>(rank())] = completed_step.value_or(-1);
  const int64_t policy = regroup_enabled_ ? 1 : 0;
  votes[w] = policy;
  votes[w + 1] = -policy;
  for (size_t r = 0; r < w; ++r) votes[w + 2 + r] = 0;
  votes[w + 2 + static_cast<size_t>(rank())] = completed_step && is_chief() ? 1 : 0;
  group().allreduce_max(votes);
  if (votes[w] != -votes[w + 1]) {
    throw InvalidArgument("rank " + std::to_string(rank()) + " runs with supervisor.on_peer_loss " +
                          (policy ? "regroup" : "exit") +
                          " but another replica does not: give every replica the same "
                          "supervisor.on_peer_loss");
  }
  int surviving_chief = -1, lowest_survivor = -1;
  for (int r = 0; r < world_size(); ++r) {
    const int64_t s = votes[static_cast<size_t>(r)];
    if (s >= 0) {
      source.survivors = true;
      if (lowest_survivor < 0) lowest_survivor = r;
      if (surviving_chief < 0 && votes[w + 2 + static_cast<size_t>(r)] == 1) surviving_chief = r;
    }
    if (s > source.step) {
      source.step = s;
      source.root = r;
    }
  }
  if (!source.survivors) source.root = 0;
  source.chief = surviving_chief >= 0 ? surviving_chief : std::max(lowest_survivor, 0);
  if (completed_step && source.chief != chief_) {  // a survivor saw its chief go
    LH_LOG(WARNING) << "the chief was lost: the lowest surviving rank takes the chief role "
                       "(checkpoints, events, training.done); ranks and data shards are unchanged"
                    << kv("rank", rank()) << kv("lost_chief_rank", chief_)
                    << kv("chief_rank", source.chief);
  }
  chief_ = source.chief;
  return source;
}

void DataParallel::set_regroup(RendezvousOptions options, double timeout_secs) {
  regroup_options_ = std::move(options);
  regroup_options_.regroup = true;
  regroup_options_.max_wait_secs = timeout_secs;
  regroup_enabled_ = true;
}

bool DataParallel::regroup(supervisor::TrainingState& state) {
  if (!regroup_enabled_) throw FailedPrecondition("regroup called without set_regroup");
  const auto start = std::chrono::steady_clock::now();
  // 1. Drop the broken group: joining the communication thread first (it fails or finishes its
  // bucket within the collective timeout), then closing every socket so that peers still blocked
  // in a collective with this replica fail now rather than after their collective timeout.
  if (overlap_model_ != nullptr) {
    overlap_model_->set_gradient_ready_callback({});
    overlap_model_ = nullptr;
  }
  pending_ = {};
  stop_communication_thread();
  {
    MutexLock lock(mu_);
    comm_error_ = nullptr;
    stop_ = false;
  }
  comm_.reset();
  device_.reset();        // an NCCL communicator was bootstrapped over the old group
  plan_checked_ = false;  // a replacement checks the gradient plan at its first step: so do we
  LH_LOG(WARNING) << "regrouping: waiting for the lost replica's replacement" << kv("rank", rank())
                  << kv("step", state.global_step())
                  << kv("regroup_timeout_secs", regroup_options_.max_wait_secs);
  // 2. A new generation with the replacement, bounded by the regroup timeout.
  try {
    comm_ = rendezvous(regroup_options_);
  } catch (const DeadlineExceeded& e) {
    LH_LOG(ERROR) << "the data-parallel group could not be re-formed within "
                     "supervisor.regroup_timeout_secs"
                  << kv("rank", rank()) << kv("step", state.global_step()) << kv("error", e.what());
    return false;
  } catch (const Aborted&) {
    throw PeerLost("a peer was lost while the group re-formed; regrouping again");
  }
  // 3-4. Agree on the state to continue from and hand it to everyone.
  stop_here_for_test("regroup");
  const StateSource source = agree_state_source(state.global_step());
  const auto wait = std::chrono::milliseconds(static_cast<int64_t>(
      (regroup_options_.max_wait_secs + regroup_options_.collective_timeout_secs) * 1000));
  broadcast_state(state, wait, source.root);
  ++regroups_;
  LH_LOG(WARNING)
      << "regrouped: training continues in place" << kv("rank", rank()) << kv("step", source.step)
      << kv("state_from_rank", source.root) << kv("chief_rank", source.chief)
      << kv("seconds",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return true;
}

int64_t DataParallel::finish_with_chief(int64_t step, std::chrono::milliseconds timeout) {
  if (world_size() == 1) return step;
  quiesce();
  stop_here_for_test("finish");
  group().broadcast(std::as_writable_bytes(std::span<int64_t>(&step, 1)), chief_, timeout);
  return step;
}

double DataParallel::mean_over_ranks(double value) {
  if (world_size() == 1) return value;
  quiesce();
  float v = static_cast<float>(value);
  group().allreduce_sum(std::span<float>(&v, 1));
  return static_cast<double>(v) / world_size();
}

}  // namespace longhaul::dist
