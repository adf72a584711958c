// Rendezvous, collectives and DataParallel with ranks as threads of one process (fast): the
// multi-process tests of the worker binary are in tests/worker/dist_*_test.cc.
#include "longhaul/distributed/communicator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <latch>
#include <optional>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/distributed/data_parallel.h"
#include "longhaul/model/cpu/gpt2_cpu.h"
#include "longhaul/testing/temp_dir.h"

namespace longhaul::dist {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A non-owning view of a communicator, for DataParallel (which owns its communicator).
class ProxyCommunicator : public Communicator {
 public:
  explicit ProxyCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  void allreduce_sum(std::span<float> d) override { inner_.allreduce_sum(d); }
  void allreduce_max(std::span<int64_t> d) override { inner_.allreduce_max(d); }
  void broadcast(std::span<std::byte> d, int root, std::chrono::milliseconds t) override {
    inner_.broadcast(d, root, t);
  }
  void barrier() override { inner_.barrier(); }

 private:
  Communicator& inner_;
};

class CommunicatorTest : public ::testing::Test {
 protected:
  RendezvousOptions options(int rank, int world, std::string attempt = "0") {
    RendezvousOptions o;
    o.logdir = logdir_;
    o.attempt = std::move(attempt);
    o.rank = rank;
    o.world_size = world;
    o.max_wait_secs = 20;
    o.collective_timeout_secs = 10;
    return o;
  }

  // Runs fn(rank, communicator) on `world` threads; rethrows the first failure.
  void run_group(int world, const std::function<void(int, Communicator&)>& fn,
                 AllreduceAlgorithm algorithm = AllreduceAlgorithm::kRing,
                 const std::string& attempt = "0") {
    std::vector<std::future<void>> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(std::async(std::launch::async, [&, r] {
        auto o = options(r, world, attempt);
        o.algorithm = algorithm;
        auto comm = rendezvous(o);
        fn(r, *comm);
      }));
    }
    for (auto& f : ranks) f.get();
  }

  longhaul::testing::TempDir logdir_{"dist_comm_test"};
};

class AllreduceAlgorithmTest : public CommunicatorTest,
                               public ::testing::WithParamInterface<AllreduceAlgorithm> {};

TEST_P(AllreduceAlgorithmTest, ThreeRanksSumAndBroadcast) {
  run_group(
      3,
      [](int rank, Communicator& comm) {
        EXPECT_EQ(comm.rank(), rank);
        EXPECT_EQ(comm.world_size(), 3);
        std::vector<float> v(1001);
        for (size_t i = 0; i < v.size(); ++i)
          v[i] = static_cast<float>(rank + 1) * static_cast<float>(i);
        comm.allreduce_sum(v);
        for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], 6.0f * static_cast<float>(i)) << i;
        comm.allreduce_sum(v);  // a second call reuses the cached plan
        EXPECT_EQ(v[10], 180.0f);
        std::vector<int64_t> m{rank, -rank};
        comm.allreduce_max(m);
        EXPECT_EQ(m, (std::vector<int64_t>{2, 0}));
        std::string text = rank == 1 ? "from rank one" : "xxxxxxxxxxxxx";
        comm.broadcast(std::as_writable_bytes(std::span<char>(text.data(), text.size())), 1);
        EXPECT_EQ(text, "from rank one");
        comm.barrier();
      },
      GetParam());
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AllreduceAlgorithmTest,
                         ::testing::Values(AllreduceAlgorithm::kRing,
                                           AllreduceAlgorithm::kHalvingDoubling,
                                           AllreduceAlgorithm::kBcube));

TEST_F(CommunicatorTest, ParsesAlgorithmNames) {
  EXPECT_EQ(parse_allreduce_algorithm("halving-doubling"), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_THROW(parse_allreduce_algorithm("tree"), InvalidArgument);
}

TEST_F(CommunicatorTest, SingleReplicaNeedsNoRendezvous) {
  auto comm = rendezvous(options(0, 1));
  std::vector<float> v{1, 2};
  comm->allreduce_sum(v);
  EXPECT_EQ(v, (std::vector<float>{1, 2}));
  EXPECT_FALSE(fs::exists(rendezvous_dir(logdir_, "0")));
}

TEST_F(CommunicatorTest, ChiefThatNeverComesIsDeadlineExceededNamingMissingRanks) {
  auto o = options(1, 3);
  o.max_wait_secs = 0.3;
  try {
    rendezvous(o);
    FAIL() << "rendezvous returned without peers";
  } catch (const DeadlineExceeded& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("rank(s) 0 (the chief never opened the rendezvous), 2 never arrived"));
    EXPECT_THAT(e.what(), HasSubstr("max_wait_secs"));
  }
}

TEST_F(CommunicatorTest, ChiefWaitingForAWorkerNamesIt) {
  auto o = options(0, 2);
  o.max_wait_secs = 0.3;
  try {
    rendezvous(o);
    FAIL();
  } catch (const DeadlineExceeded& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank(s) 1 never arrived"));
  }
}

TEST_F(CommunicatorTest, NonChiefStartedEarlyWaitsForTheChief) {
  std::atomic<bool> waiting{false};
  auto worker = std::async(std::launch::async, [&] {
    auto o = options(1, 2);
    o.cancelled = [&] {
      waiting = true;
      return false;
    };
    auto comm = rendezvous(o);
    std::vector<float> v{1};
    comm->allreduce_sum(v);
    return v[0];
  });
  // The worker is polling (it has called the cancellation probe) before the chief exists.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!waiting && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(waiting);
  auto chief = rendezvous(options(0, 2));
  std::vector<float> v{2};
  chief->allreduce_sum(v);
  EXPECT_EQ(v[0], 3.0f);
  EXPECT_EQ(worker.get(), 3.0f);
}

// A member that arrived and then vanished before the mesh connected (killed, or frozen before
// it published its address) does not hold the group: the chief's connect fails within the
// connect timeout, it opens a new generation, and the group forms with whoever comes next.
TEST_F(CommunicatorTest, MemberLostAfterArrivingIsLeftBehindInANewGeneration) {
  const fs::path dir = rendezvous_dir(logdir_, "0");
  auto chief = std::async(std::launch::async, [&] {
    auto o = options(0, 2);
    o.connect_timeout_secs = 0.5;
    return rendezvous(o);
  });
  auto generation = [&]() -> std::string {
    try {
      return file::read_file(dir / "generation");
    } catch (const Error&) {
      return "";
    }
  };
  auto wait_for = [](const std::function<bool()>& condition) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!condition() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return condition();
  };
  ASSERT_TRUE(wait_for([&] { return !generation().empty(); }));
  const std::string first = generation();
  // A ghost rank 1 arrives in that generation and never connects.
  file::write_atomically(dir / ("arrived." + first + ".1"), "ghost");
  ASSERT_TRUE(wait_for([&] { return !generation().empty() && generation() != first; }))
      << "the chief never gave up on the generation with the lost member";
  auto worker = rendezvous(options(1, 2));
  auto comm = chief.get();
  std::vector<float> mine{2}, theirs{1};
  auto other = std::async(std::launch::async, [&] { worker->allreduce_sum(theirs); });
  comm->allreduce_sum(mine);
  other.get();
  EXPECT_EQ(mine[0], 3.0f);
  EXPECT_EQ(theirs[0], 3.0f);
}

TEST_F(CommunicatorTest, ReusedAttemptFolderIsReplacedNotFatal) {
  for (int round = 0; round < 2; ++round) {
    run_group(2, [](int, Communicator& comm) {
      std::vector<float> v{1};
      comm.allreduce_sum(v);
      EXPECT_EQ(v[0], 2.0f);
    });
  }
}

// Regression (the flake of ReusedAttemptFolderIsReplacedNotFatal under load): the chief clears
// the reused folder one file at a time. A non-chief polling in the middle of that clean-up saw
// the previous run's `generation` and `arrived.G.0` still there, wrote its own `arrived.G.1`,
// found every rank "arrived" and left for a Gloo mesh nobody else joined, while the chief, in
// its new generation, waited max_wait_secs for rank 1. This builds that moment exactly: the
// previous run's files without this rank's arrival. A non-chief must join only a generation
// whose chief confirmed it.
TEST_F(CommunicatorTest, NonChiefNeverJoinsAGenerationItsChiefDidNotConfirm) {
  const fs::path dir = rendezvous_dir(logdir_, "0");
  fs::create_directories(dir);
  std::ofstream(dir / "generation") << "oldgeneration";
  std::ofstream(dir / "arrived.oldgeneration.0") << "previous-chief";
  auto non_chief = std::async(std::launch::async, [&] {
    auto comm = rendezvous(options(1, 2));
    std::vector<float> v{1};
    comm->allreduce_sum(v);
    return v[0];
  });
  // The chief comes only once the non-chief has made up its mind about the old files: it either
  // went on to the Gloo mesh (a store key appears: the defect) or marked the generation stale
  // and waits. A condition on the folder, not a sleep.
  auto store_keys = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name != "generation" && !name.starts_with("present.") && !name.starts_with("arrived.") &&
          !name.starts_with("members.") && name.find(".tmp.") == std::string::npos) {
        ++n;
      }
    }
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (store_keys() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto chief = rendezvous(options(0, 2));
  std::vector<float> v{1};
  chief->allreduce_sum(v);
  EXPECT_EQ(v[0], 2.0f);
  EXPECT_EQ(non_chief.get(), 2.0f);
}

TEST_F(CommunicatorTest, ChiefRemovesStaleAttemptFolders) {
  fs::create_directories(rendezvous_dir(logdir_, "old-attempt") / "junk");
  run_group(
      2, [](int, Communicator& comm) { comm.barrier(); }, AllreduceAlgorithm::kRing, "new");
  EXPECT_FALSE(fs::exists(rendezvous_dir(logdir_, "old-attempt")));
  EXPECT_TRUE(fs::exists(rendezvous_dir(logdir_, "new")));
}

TEST_F(CommunicatorTest, UnresolvableOwnAddressNamesTheHostOverride) {
  auto o = options(1, 2);
  o.bind_host = "no-such-pod.no-such-service.invalid";
  o.max_wait_secs = 0.2;
  try {
    rendezvous(o);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot resolve its address 'no-such-pod"));
    EXPECT_THAT(e.what(), HasSubstr("LONGHAUL_HOST_OVERRIDE=127.0.0.1"));
  }
}

// Regression: on a node without cluster DNS (the real-node test, tests/node), every replica
// waited for its own TF_CONFIG name (tiny-chief-0.tiny.ml.svc) to resolve until max_wait_secs,
// though the pod's /etc/hosts maps its hostname (the name's first label) to its IP.
TEST_F(CommunicatorTest, PodDnsNameThatDoesNotResolveFallsBackToItsHostname) {
  char hostname[256] = {};
  ASSERT_EQ(::gethostname(hostname, sizeof hostname - 1), 0);
  std::vector<std::future<float>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto o = options(r, 2);
      o.bind_host = std::string(hostname) + ".no-such-subdomain.invalid";
      o.max_wait_secs = 5;
      auto comm = rendezvous(o);
      std::vector<float> v{1};
      comm->allreduce_sum(v);
      return v[0];
    }));
  }
  for (auto& f : ranks) EXPECT_EQ(f.get(), 2.0f);
}

TEST_F(CommunicatorTest, AddressOfAnotherMachineIsRefused) {
  auto o = options(1, 2);
  o.bind_host = "192.0.2.1";  // TEST-NET-1: never a local address
  EXPECT_THROW(rendezvous(o), InvalidArgument);
}

TEST_F(CommunicatorTest, UnknownInterfaceIsRefused) {
  auto o = options(1, 2);
  o.bind_iface = "nosuchif0";
  EXPECT_THROW(rendezvous(o), InvalidArgument);
}

TEST_F(CommunicatorTest, CancelledWhileWaiting) {
  auto o = options(1, 2);
  o.cancelled = [] { return true; };
  EXPECT_THROW(rendezvous(o), Cancelled);
}

TEST_F(CommunicatorTest, DeadPeerAbortsTheCollectiveAtOnce) {
  std::latch connected(2);
  auto survivor = std::async(std::launch::async, [&] {
    auto comm = rendezvous(options(0, 2));
    connected.count_down();
    std::vector<float> v(100, 1.0f);
    comm->allreduce_sum(v);  // the peer closes its sockets instead of joining
  });
  {
    auto peer = rendezvous(options(1, 2));
    connected.arrive_and_wait();
  }  // destroyed: its connections close
  try {
    survivor.get();
    FAIL() << "the all-reduce with a dead peer succeeded";
  } catch (const Aborted& e) {
    EXPECT_THAT(e.what(), HasSubstr("all-reduce of 100 floats failed on rank 0 of 2"));
    EXPECT_THAT(e.what(), HasSubstr("138"));
  }
}

TEST_F(CommunicatorTest, HungPeerAbortsAfterTheCollectiveTimeout) {
  std::latch done(1);
  std::latch connected(2);
  auto peer = std::async(std::launch::async, [&] {
    auto o = options(1, 2);
    o.collective_timeout_secs = 0.5;
    auto comm = rendezvous(o);
    connected.count_down();
    done.wait();  // alive but never joins the collective
  });
  auto o = options(0, 2);
  o.collective_timeout_secs = 0.5;
  auto comm = rendezvous(o);
  connected.arrive_and_wait();
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> v(10, 1.0f);
  EXPECT_THROW(comm->allreduce_sum(v), Aborted);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.4);
  EXPECT_THROW(comm->barrier(), Aborted) << "a failed group stays failed";
  done.count_down();
  peer.get();
}

// A TrainingState of two tensors and some metadata.
class FakeState : public supervisor::TrainingState {
 public:
  explicit FakeState(int n) : a_(static_cast<size_t>(n)), b_(3) {}
  std::vector<supervisor::TensorSpec> tensor_specs() const override {
    return {{"a", supervisor::DType::kF32, {static_cast<int64_t>(a_.size())}},
            {"b", supervisor::DType::kF32, {3}}};
  }
  void initialize() override {}
  void restore(const supervisor::TensorSource& src) override {
    std::memcpy(a_.data(), src.data("a").data(), a_.size() * 4);
    std::memcpy(b_.data(), src.data("b").data(), 12);
    step_ = std::stoll(src.metadata().at("step"));
    position_ = src.metadata().at("data_position");
  }
  void snapshot(supervisor::Snapshot& out) override {
    out.reshape(tensor_specs());
    std::memcpy(out.buffers[0].data(), a_.data(), a_.size() * 4);
    std::memcpy(out.buffers[1].data(), b_.data(), 12);
    out.step = step_;
    out.metadata = {{"step", std::to_string(step_)}, {"data_position", position_}};
  }
  int64_t global_step() const override { return step_; }

  std::vector<float> a_, b_;
  int64_t step_ = 0;
  std::string position_ = "start";
};

TEST_F(CommunicatorTest, BroadcastStateMakesEveryRankTheChiefsCopy) {
  run_group(3, [](int rank, Communicator& comm) {
    FakeState state(1000);
    std::fill(state.a_.begin(), state.a_.end(), static_cast<float>(rank));
    state.b_ = {1.5f * static_cast<float>(rank), 2, 3};
    state.step_ = rank == 0 ? 42 : 0;
    state.position_ = rank == 0 ? R"({"epoch":1})" : "other";
    DataParallel dp(std::make_unique<ProxyCommunicator>(comm));
    dp.broadcast_state(state);
    EXPECT_EQ(state.a_, std::vector<float>(1000, 0.0f));
    EXPECT_EQ(state.b_, (std::vector<float>{0, 2, 3}));
    EXPECT_EQ(state.step_, 42);
    EXPECT_EQ(state.position_, R"({"epoch":1})");
  });
}

TEST_F(CommunicatorTest, BroadcastStateRefusesAnotherModelShapeOnEveryRank) {
  // A config mismatch is a usage error on every replica (exit 2, no pointless group restart):
  // the odd rank names the first differing tensor, the others name the odd rank.
  std::vector<std::string> messages(3);
  run_group(3, [&](int rank, Communicator& comm) {
    FakeState state(rank == 2 ? 11 : 10);
    DataParallel dp(std::make_unique<ProxyCommunicator>(comm));
    try {
      dp.broadcast_state(state);
    } catch (const InvalidArgument& e) {
      messages[static_cast<size_t>(rank)] = e.what();
    }
  });
  EXPECT_THAT(messages[2], HasSubstr("tensor 0"));
  EXPECT_THAT(messages[2], HasSubstr("same model config"));
  EXPECT_THAT(messages[0], HasSubstr("rank 2 runs another model config"));
  EXPECT_THAT(messages[1], HasSubstr("rank 2 runs another model config"));
}

TEST_F(CommunicatorTest, AnyStopEndsEveryRankAndTellsWhoStopped) {
  run_group(3, [](int rank, Communicator& comm) {
    DataParallel dp(std::make_unique<ProxyCommunicator>(comm));
    EXPECT_FALSE(dp.any_stop(false));
    EXPECT_TRUE(dp.any_stop(rank == 2));
    EXPECT_EQ(dp.stop_requested_by_peer(), rank != 2);
  });
}

// Chief promotion (data_parallel.h): the chief role is agreed at each (re)formation. It stays
// with a surviving chief, moves to the lowest surviving rank when the chief is the one lost, and
// never goes to a replacement (a process without state) while a survivor exists.
TEST_F(CommunicatorTest, ChiefRoleStaysWithASurvivorAndMovesToTheLowestSurvivorWhenLost) {
  using Steps = std::vector<std::optional<int64_t>>;  // per rank; nullopt: a fresh process
  struct Formation {
    const char* what;
    Steps steps;
    int chief, root;
    int64_t step;
  };
  const std::vector<Formation> formations = {
      {"fresh start", {std::nullopt, std::nullopt, std::nullopt, std::nullopt}, 0, 0, -1},
      {"chief lost at 40/41", {std::nullopt, 40, 41, 40}, 1, 2, 41},
      {"worker 3 lost: the surviving chief keeps the role", {50, 50, 50, std::nullopt}, 1, 0, 50},
      {"chief lost again: the lowest survivor", {61, std::nullopt, 61, 60}, 0, 0, 61},
  };
  run_group(4, [&](int rank, Communicator& comm) {
    DataParallel dp(std::make_unique<ProxyCommunicator>(comm));
    for (const Formation& f : formations) {
      const StateSource source = dp.agree_state_source(f.steps[static_cast<size_t>(rank)]);
      EXPECT_EQ(source.chief, f.chief) << f.what << ", rank " << rank;
      EXPECT_EQ(source.root, f.root) << f.what << ", rank " << rank;
      EXPECT_EQ(source.step, f.step) << f.what << ", rank " << rank;
      EXPECT_EQ(dp.chief_rank(), f.chief) << f.what << ", rank " << rank;
      EXPECT_EQ(dp.is_chief(), rank == f.chief) << f.what << ", rank " << rank;
    }
  });
}

// A model on a device whose gradients Gloo does not reduce (a CUDA model: NCCL). Only what
// DataParallel touches is real: the name and the flat gradient buffer (kept in host memory here).
class FakeDeviceModel : public model::LanguageModel {
 public:
  explicit FakeDeviceModel(size_t n) : grads_(n) {}
  const model::GPT2Config& config() const override { return config_; }
  std::string_view device_name() const override { return "fake-device"; }
  model::MemorySpace memory_space() const override { return model::MemorySpace::kDevice; }
  std::string numerical_environment() const override { return "fake-device"; }
  int64_t num_parameters() const override { return static_cast<int64_t>(grads_.size()); }
  int max_batch_size() const override { return 1; }
  int max_seq_len() const override { return 1; }
  void init_weights(uint64_t) override {}
  float forward_backward(const int32_t*, const int32_t*, int, int, float) override { return 0; }
  float forward_loss(const int32_t*, const int32_t*, int, int) override { return 0; }
  void zero_grad() override {}
  float gradient_norm() override { return 0; }
  void optimizer_step(const model::AdamWOptions&, float, float) override {}
  std::span<float> parameters_flat() override { return grads_; }
  std::span<float> gradients_flat() override { return grads_; }
  std::vector<model::NamedTensor> named_parameters() override { return {}; }
  std::vector<model::NamedTensor> named_optimizer_state() override { return {}; }
  int64_t optimizer_step_count() const override { return 0; }
  void set_optimizer_step_count(int64_t) override {}

  std::vector<float> grads_;

 private:
  model::GPT2Config config_{};
};

// Stands in for NCCL without a GPU: the mean over the group it was made for (by Gloo); it throws
// Aborted, as an NCCL communicator aborted after a lost peer does, while `fail` is set.
class FakeDeviceAllreduce : public DeviceAllreduce {
 public:
  FakeDeviceAllreduce(Communicator& group, const std::atomic<bool>& fail)
      : group_(group), fail_(fail) {}
  void allreduce_mean(float* data, size_t count) override {
    if (fail_.load()) throw Aborted("fake device all-reduce: a peer was lost");
    group_.allreduce_sum(std::span<float>(data, count));
    for (size_t i = 0; i < count; ++i) data[i] /= static_cast<float>(group_.world_size());
  }

 private:
  Communicator& group_;
  const std::atomic<bool>& fail_;
};

// The regroup path of a device model is the Gloo path (data_parallel.h): its all-reduce is made
// over the group at the first step, a failure of it reaches the training loop as Aborted, and
// after the regroup a new one is made over the NEW group (a device communicator is bound to the
// members it was made for and never reused), after which the mean is right again.
TEST_F(CommunicatorTest, DeviceAllreduceIsRemadeOverTheNewGroupAfterARegroup) {
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      std::atomic<bool> fail{false};
      std::vector<const Communicator*> made_over;
      DataParallelOptions o;
      o.make_device_allreduce = [&](Communicator& group) {
        made_over.push_back(&group);
        return std::make_unique<FakeDeviceAllreduce>(group, fail);
      };
      DataParallel dp(rendezvous(options(r, 3)), o);
      dp.set_regroup(options(r, 3), 20);
      FakeDeviceModel model(64);
      auto step = [&] {
        std::fill(model.grads_.begin(), model.grads_.end(), static_cast<float>(r + 1));
        dp.average_gradients(model);
      };
      step();
      step();
      EXPECT_EQ(model.grads_, std::vector<float>(64, 2.0f)) << "mean of 1, 2, 3";
      EXPECT_EQ(dp.device_allreduces_made(), 1) << "made once per group, not per step";
      fail = true;  // a peer is lost: the device collective fails on every rank
      EXPECT_THROW(step(), Aborted);
      fail = false;
      FakeState state(8);
      state.step_ = 7;
      ASSERT_TRUE(dp.regroup(state));
      step();
      EXPECT_EQ(model.grads_, std::vector<float>(64, 2.0f));
      EXPECT_EQ(dp.device_allreduces_made(), 2);
      ASSERT_EQ(made_over.size(), 2u);
      EXPECT_EQ(made_over[1], &dp.communicator()) << "made over the re-formed group";
    }));
  }
  for (auto& f : ranks) f.get();
}

TEST_F(CommunicatorTest, LossShownByEveryRankIsTheMeanOverRanks) {
  run_group(3, [](int rank, Communicator& comm) {
    DataParallel dp(std::make_unique<ProxyCommunicator>(comm));
    // Losses 2, 3, 7: each rank gets 4, not its own value.
    const double own[] = {2.0, 3.0, 7.0};
    EXPECT_DOUBLE_EQ(dp.mean_over_ranks(own[rank]), 4.0);
  });
}

TEST_F(CommunicatorTest, AverageGradientsOfTheCpuModelIsTheMean) {
  model::GPT2Config config{
      .vocab_size = 16, .context_length = 8, .n_layer = 1, .n_head = 2, .n_embd = 8};
  run_group(2, [&](int rank, Communicator& comm) {
    auto model = model::make_cpu_gpt2(config, 1, 8);
    auto grads = model->gradients_flat();
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(rank * 2 + i % 3);
    DataParallel dp(std::make_unique<ProxyCommunicator>(comm));
    dp.average_gradients(*model);
    for (size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(grads[i], 1.0f + static_cast<float>(i % 3));
  });
}

// Overlapped, bucketed averaging (DataParallelOptions) against the whole-buffer all-reduce on
// the same gradients: gradient accumulation over two micro-batches, the overlapped all-reduce
// started only for the last one, as the trainer does.
class OverlapTest : public CommunicatorTest, public ::testing::WithParamInterface<size_t> {};

std::vector<int32_t> tokens_for(int rank, int micro, size_t n, int vocab) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<int32_t>((i * 7 + static_cast<size_t>(rank) * 13 + micro * 5) % vocab);
  }
  return v;
}

TEST_P(OverlapTest, OverlappedAveragingEqualsTheWholeBufferAllreduce) {
  const size_t bucket_bytes = GetParam();
  const model::GPT2Config config{
      .vocab_size = 32, .context_length = 8, .n_layer = 3, .n_head = 2, .n_embd = 16};
  run_group(3, [&](int rank, Communicator& comm) {
    auto overlapped = model::make_cpu_gpt2(config, 2, 8);
    auto reference = model::make_cpu_gpt2(config, 2, 8);
    DataParallel dp(std::make_unique<ProxyCommunicator>(comm),
                    DataParallelOptions{.bucket_bytes = bucket_bytes});
    DataParallel whole(std::make_unique<ProxyCommunicator>(comm),
                       DataParallelOptions{.overlap_allreduce = false});
    for (int step = 0; step < 2; ++step) {
      overlapped->zero_grad();
      reference->zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        const auto x = tokens_for(rank, micro + 2 * step, 16, 32);
        const auto y = tokens_for(rank + 1, micro + 2 * step, 16, 32);
        if (micro == 1) dp.start_gradient_averaging(*overlapped);
        overlapped->forward_backward(x.data(), y.data(), 2, 8, 0.5f);
        reference->forward_backward(x.data(), y.data(), 2, 8, 0.5f);
      }
      dp.average_gradients(*overlapped);
      whole.average_gradients(*reference);
      EXPECT_FALSE(overlapped->has_gradient_ready_callback());
      const auto got = overlapped->gradients_flat();
      const auto want = reference->gradients_flat();
      float max_abs = 0;
      for (float g : want) max_abs = std::max(max_abs, std::abs(g));
      ASSERT_GT(max_abs, 0.0f);
      for (size_t i = 0; i < want.size(); ++i) {
        // The ring sums each element over the ranks in an order that depends on the buffer's
        // size, so a bucket may differ from the whole buffer in the last bit.
        ASSERT_NEAR(got[i], want[i], 1e-6f * max_abs) << "element " << i << ", step " << step;
      }
      // Other collectives after an overlapped step use the communicator safely.
      EXPECT_FALSE(dp.any_stop(false));
      EXPECT_DOUBLE_EQ(dp.mean_over_ranks(static_cast<double>(rank)), 1.0);
      // Apply the same update to both so the next step starts from equal weights.
      overlapped->optimizer_step({}, 1e-3f, 1.0f);
      reference->optimizer_step({}, 1e-3f, 1.0f);
    }
    // tiny buckets: one per reported range (ln_f, 3 blocks, wte+wpe); huge: one bucket;
    // automatic: a quarter of the buffer at most, so a few.
    if (bucket_bytes == 4) {
      EXPECT_EQ(dp.last_bucket_count(), static_cast<size_t>(config.n_layer) + 2);
    } else if (bucket_bytes > 1000000) {
      EXPECT_EQ(dp.last_bucket_count(), 1u);
    } else {
      EXPECT_GE(dp.last_bucket_count(), 2u);
    }
    EXPECT_EQ(dp.averaged_steps(), 2);
    EXPECT_GT(dp.allreduce_busy_seconds(), 0.0);
    EXPECT_TRUE(dp.communication_thread_running());
    EXPECT_FALSE(whole.communication_thread_running());
  });
}

INSTANTIATE_TEST_SUITE_P(BucketBytes, OverlapTest,
                         ::testing::Values(size_t{4}, size_t{0}, size_t{1} << 30),
                         [](const auto& info) {
                           return info.param == 4   ? std::string("Tiny")
                                  : info.param == 0 ? std::string("Automatic")
                                                    : std::string("Huge");
                         });

// A communicator that dies (closes its connections, like a killed process) at its n-th
// all-reduce of floats, instead of taking part.
class DyingCommunicator : public Communicator {
 public:
  DyingCommunicator(std::unique_ptr<Communicator> inner, int die_at)
      : inner_(std::move(inner)),
        rank_(inner_->rank()),
        world_(inner_->world_size()),
        die_at_(die_at) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void allreduce_sum(std::span<float> d) override {
    if (++calls_ == die_at_) inner_.reset();
    if (!inner_) throw Aborted("this rank died");
    inner_->allreduce_sum(d);
  }
  void allreduce_max(std::span<int64_t> d) override { live().allreduce_max(d); }
  void broadcast(std::span<std::byte> d, int root, std::chrono::milliseconds t) override {
    live().broadcast(d, root, t);
  }
  void barrier() override { live().barrier(); }

 private:
  Communicator& live() {
    if (!inner_) throw Aborted("this rank died");
    return *inner_;
  }
  std::unique_ptr<Communicator> inner_;
  int rank_, world_;
  int die_at_, calls_ = 0;
};

TEST_F(CommunicatorTest, PeerDyingMidBucketsAbortsTheSurvivorsAndJoinsTheThread) {
  const model::GPT2Config config{
      .vocab_size = 32, .context_length = 8, .n_layer = 4, .n_head = 2, .n_embd = 16};
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      std::unique_ptr<Communicator> comm = rendezvous(options(r, 3));
      // Rank 2 dies at the third bucket of the step (after two completed all-reduces).
      if (r == 2) comm = std::make_unique<DyingCommunicator>(std::move(comm), 3);
      auto model = model::make_cpu_gpt2(config, 2, 8);
      DataParallel dp(std::move(comm), DataParallelOptions{.bucket_bytes = 4});
      const auto x = tokens_for(r, 0, 16, 32);
      model->zero_grad();
      dp.start_gradient_averaging(*model);
      model->forward_backward(x.data(), x.data(), 2, 8, 1.0f);
      try {
        dp.average_gradients(*model);
        ADD_FAILURE() << "rank " << r << " averaged gradients with a dead peer";
      } catch (const Aborted& e) {
        if (r != 2) {
          EXPECT_THAT(e.what(), HasSubstr("138")) << "rank " << r;
        }
      }
      EXPECT_FALSE(dp.communication_thread_running()) << "rank " << r;
      EXPECT_FALSE(model->has_gradient_ready_callback()) << "rank " << r;
      // The group stays failed: the next collective is refused at once, no hang.
      EXPECT_THROW(dp.any_stop(false), Aborted) << "rank " << r;
    }));
  }
  for (auto& f : ranks) f.get();
}

// Replicas that would cut the gradients into different buckets (here: overlap on one, off on the
// other) would pair their all-reduces wrongly; the first gradient collective refuses on both.
TEST_F(CommunicatorTest, ReplicasWithDifferentBucketPlansAreRefusedOnEveryRank) {
  const model::GPT2Config config{
      .vocab_size = 32, .context_length = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
  run_group(2, [&](int rank, Communicator& comm) {
    auto model = model::make_cpu_gpt2(config, 2, 8);
    DataParallel dp(std::make_unique<ProxyCommunicator>(comm),
                    DataParallelOptions{.overlap_allreduce = rank == 0});
    const auto x = tokens_for(rank, 0, 16, 32);
    try {
      dp.start_gradient_averaging(*model);
      model->forward_backward(x.data(), x.data(), 2, 8, 1.0f);
      dp.average_gradients(*model);
      ADD_FAILURE() << "rank " << rank << " averaged with a mismatched plan";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("--allreduce-overlap")) << "rank " << rank;
    }
    EXPECT_FALSE(model->has_gradient_ready_callback());
  });
}

}  // namespace
}  // namespace longhaul::dist
