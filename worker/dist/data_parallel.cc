// DataParallel: state broadcast, gradient averaging, stop agreement. See data_parallel.h.
#include "longhaul/dist/data_parallel.h"

#include <chrono>
#include <cstring>

#include <nlohmann/json.hpp>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"
#include "longhaul/dist/nccl.h"

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

void broadcast_string(Communicator& comm, std::string& text, std::chrono::milliseconds timeout) {
  int64_t size = static_cast<int64_t>(text.size());
  comm.broadcast(std::as_writable_bytes(std::span<int64_t>(&size, 1)), 0, timeout);
  text.resize(static_cast<size_t>(size));
  comm.broadcast(std::as_writable_bytes(std::span<char>(text.data(), text.size())), 0);
}

}  // namespace

DataParallel::DataParallel(std::unique_ptr<Communicator> comm,
                           std::unique_ptr<DeviceAllreduce> device,
                           std::chrono::milliseconds device_timeout)
    : comm_(std::move(comm)), device_(std::move(device)), device_timeout_(device_timeout) {
  if (!comm_) throw InvalidArgument("DataParallel needs a communicator");
}

DataParallel::~DataParallel() = default;

void DataParallel::broadcast_state(supervisor::TrainingState& state,
                                   std::chrono::milliseconds timeout) {
  if (world_size() == 1) return;
  const auto start = std::chrono::steady_clock::now();
  supervisor::Snapshot snap;
  const auto my_specs = state.tensor_specs();
  std::string header;
  if (rank() == 0) {
    state.snapshot(snap);
    header =
        json{{"step", snap.step}, {"metadata", snap.metadata}, {"specs", specs_json(snap.specs)}}
            .dump();
  }
  broadcast_string(*comm_, header, timeout);
  json parsed = json::parse(header);
  if (rank() != 0) {
    const json theirs = parsed["specs"];
    const json mine = specs_json(my_specs);
    for (size_t i = 0; i < std::max(theirs.size(), mine.size()); ++i) {
      const json a = i < theirs.size() ? theirs[i] : json();
      const json b = i < mine.size() ? mine[i] : json();
      if (a != b) {
        throw FailedPrecondition("rank " + std::to_string(rank()) +
                                 " cannot take the chief's state: tensor " + std::to_string(i) +
                                 " is " + a.dump() + " on the chief but " + b.dump() +
                                 " here. Every replica must run the same model config");
      }
    }
    snap.reshape(my_specs);
    snap.step = parsed["step"].get<int64_t>();
    snap.metadata = parsed["metadata"].get<std::map<std::string, std::string>>();
  }
  for (auto& buffer : snap.buffers) comm_->broadcast(buffer, 0);
  if (rank() != 0) {
    SnapshotSource source(snap);
    state.restore(source);
  }
  LH_LOG(INFO)
      << "replicas synchronised from the chief" << kv("rank", rank()) << kv("step", snap.step)
      << kv("tensors", snap.buffers.size())
      << kv("seconds",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

void DataParallel::average_gradients(model::LanguageModel& model) {
  if (world_size() == 1) return;
  const auto start = std::chrono::steady_clock::now();
  std::span<float> grads = model.gradients_flat();
  if (model.device_name() == "cpu") {
    comm_->allreduce_sum(grads);
    const float scale = 1.0f / static_cast<float>(world_size());
    for (float& g : grads) g *= scale;
  } else if (device_ || nccl_available()) {
    // A CUDA model: NCCL, created at the first step on the training thread (whose current
    // device is the model's), bootstrapped over this group's communicator.
    if (!device_) device_ = make_nccl_allreduce(*comm_, -1, device_timeout_);
    device_->allreduce_mean(grads.data(), grads.size());
    // ncclAvg: already the mean.
  } else {
    throw FailedPrecondition("the " + std::string(model.device_name()) +
                             " model needs NCCL for gradient all-reduce, and this build has no "
                             "NCCL; train on CPU or build with CUDA and NCCL");
  }
  allreduce_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool DataParallel::any_stop(bool local_stop) {
  if (world_size() == 1) return local_stop;
  int64_t flag = local_stop ? 1 : 0;
  comm_->allreduce_max(std::span<int64_t>(&flag, 1));
  if (flag != 0 && !local_stop) stop_by_peer_ = true;
  return flag != 0;
}

double DataParallel::mean_over_ranks(double value) {
  if (world_size() == 1) return value;
  float v = static_cast<float>(value);
  comm_->allreduce_sum(std::span<float>(&v, 1));
  return static_cast<double>(v) / world_size();
}

}  // namespace longhaul::dist
