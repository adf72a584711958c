// Trainer in-process: snapshot -> safetensors -> restore resumes bit-identically; another shape
// is refused naming the first mismatched tensor; accumulation and LR come from the config;
// tokens outside the vocabulary are a DataError naming their source.
#include "longhaul/trainer/trainer.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "longhaul/data/prepare.h"
#include "longhaul/model/cpu/gpt2_cpu.h"
#include "longhaul/supervisor/safetensors.h"
#include "longhaul/testing/temp_dir.h"

namespace longhaul::trainer {
namespace {

namespace fs = std::filesystem;

WorkerConfig small_config(int n_embd = 32) {
  WorkerConfig c;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.n_embd = n_embd;
  c.model.context_length = 32;
  c.training.batch_size = 2;
  c.training.seq_len = 16;
  c.training.max_steps = 20;
  c.training.warmup_steps = 4;
  c.training.learning_rate = 1e-2;
  return c;
}

std::unique_ptr<Trainer> make_trainer(const WorkerConfig& c) {
  auto data = data::embedded_dataset(false);
  data::LoaderOptions o{
      .batch_size = c.training.batch_size, .seq_len = c.training.seq_len, .seed = c.training.seed};
  return std::make_unique<Trainer>(c, model::make_cpu_gpt2(model_config_for(c), 2, 16),
                                   std::make_unique<data::DataLoader>(data, o), nullptr);
}

std::vector<float> params(Trainer& t) {
  auto p = t.model().parameters_flat();
  return {p.begin(), p.end()};
}

class TrainerTest : public ::testing::Test {
 protected:
  longhaul::testing::TempDir dir_{"longhaul_trainer_test"};
  const fs::path path_ = dir_ / "model.safetensors";
};

TEST_F(TrainerTest, SnapshotRestoreResumesBitIdentically) {
  auto a = make_trainer(small_config());
  a->initialize();
  for (int i = 0; i < 5; ++i) a->train_step();
  supervisor::Snapshot snap;
  a->snapshot(snap);
  EXPECT_EQ(snap.step, 5);
  EXPECT_EQ(snap.metadata.at("optimizer_step_count"), "5");
  supervisor::write_safetensors(path_, snap);
  std::vector<double> losses_a;
  for (int i = 0; i < 5; ++i) losses_a.push_back(a->train_step().loss);

  auto b = make_trainer(small_config());
  b->initialize();
  b->train_step();  // state that restore must overwrite
  supervisor::SafetensorsReader reader(path_);
  b->restore(reader);
  EXPECT_EQ(b->global_step(), 5);
  std::vector<double> losses_b;
  for (int i = 0; i < 5; ++i) losses_b.push_back(b->train_step().loss);
  EXPECT_EQ(losses_a, losses_b);
  const auto pa = params(*a), pb = params(*b);
  ASSERT_EQ(pa.size(), pb.size());
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0);
}

TEST_F(TrainerTest, RestoreRefusesAnotherShapeNamingTheFirstTensor) {
  auto a = make_trainer(small_config(32));
  a->initialize();
  supervisor::Snapshot snap;
  a->snapshot(snap);
  supervisor::write_safetensors(path_, snap);
  auto wide = make_trainer(small_config(64));
  supervisor::SafetensorsReader reader(path_);
  try {
    wide->restore(reader);
    FAIL() << "restored a checkpoint of another shape";
  } catch (const FailedPrecondition& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("transformer.wte.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[256, 32]"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path_.string()), std::string::npos) << msg;
  }
}

TEST_F(TrainerTest, AccumulationAndScheduleFollowTheConfig) {
  WorkerConfig c = small_config();
  c.training.total_batch_tokens = 4 * 2 * 16;
  auto t = make_trainer(c);
  EXPECT_EQ(t->accumulation_steps(), 4);
  EXPECT_EQ(t->tokens_per_step(), 128);
  EXPECT_DOUBLE_EQ(t->learning_rate_at(0), 1e-2 / 4);
  EXPECT_DOUBLE_EQ(t->learning_rate_at(3), 1e-2);
  EXPECT_NEAR(t->learning_rate_at(20), 1e-3, 1e-12);  // min_lr_ratio 0.1
  t->initialize();
  StepStats s = t->train_step();
  EXPECT_EQ(s.step, 1);
  EXPECT_EQ(s.tokens, 128);
  EXPECT_GT(s.grad_norm, 0);
  c.training.total_batch_tokens = 100;
  EXPECT_THROW(make_trainer(c), InvalidArgument);
}

// Data-parallel replicas start the overlapped all-reduce from the last-backward hook: with 4
// micro-batches per step only the last one's backward pass may report ready gradients (the
// earlier ones must not be reduced), and the gradient hook finishes after it.
TEST_F(TrainerTest, LastBackwardHookRunsOncePerStepBeforeTheLastMicroBatch) {
  WorkerConfig c = small_config();
  c.training.total_batch_tokens = 4 * 2 * 16;
  auto t = make_trainer(c);
  t->initialize();
  std::vector<std::string> events;
  t->set_last_backward_hook([&](model::LanguageModel& m) {
    events.push_back("start");
    m.set_gradient_ready_callback([&](size_t, size_t) { events.push_back("ready"); });
  });
  t->set_gradient_hook([&](model::LanguageModel& m) {
    events.push_back("finish");
    m.set_gradient_ready_callback({});
  });
  t->train_step();
  t->train_step();
  // One layer: ln_f, block 0, wte + wpe.
  const std::vector<std::string> step = {"start", "ready", "ready", "ready", "finish"};
  std::vector<std::string> want = step;
  want.insert(want.end(), step.begin(), step.end());
  EXPECT_EQ(events, want);
}

TEST_F(TrainerTest, TokensOutsideTheVocabularyAreADataError) {
  WorkerConfig c = small_config();
  c.model.vocab_size = 64;  // the byte corpus has tokens up to 255
  auto t = make_trainer(c);
  t->initialize();
  try {
    for (int i = 0; i < 20; ++i) t->train_step();
    FAIL() << "no error for out-of-vocabulary tokens";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("embedded corpus"), std::string::npos) << e.what();
  }
}

// The config's part of the device decision (selfcheck::make_model_on_device decides): the
// device, the self-check switch, the micro-batch the model is sized for, and that a replica of a
// group may not fall back to the CPU alone.
TEST_F(TrainerTest, DeviceOptionsCarryTheConfigAndForbidALoneFallbackInAGroup) {
  WorkerConfig c = small_config();
  c.device = "cuda";
  c.cuda.self_check = false;
  const selfcheck::PlanOptions one = device_options(c);
  EXPECT_EQ(one.device, "cuda");
  EXPECT_FALSE(one.self_check);
  EXPECT_EQ(one.batch_size, 2);
  EXPECT_EQ(one.seq_len, 16);
  EXPECT_TRUE(one.allow_cpu_fallback);
  EXPECT_FALSE(device_options(c, 2).allow_cpu_fallback);

  // A group's replica whose GPU fails at start stops the group instead of training on the CPU.
  c.device = "auto";
  selfcheck::PlanOptions replica = device_options(c, 4);
  replica.device_available = [](std::string*) { return true; };
  replica.device_fits = [](const model::GPT2Config&, int, int) {};
  replica.device_model = [](const model::GPT2Config&, int, int, const backend_cuda::CudaOptions&)
      -> std::unique_ptr<model::LanguageModel> { throw Internal("out of memory (test)"); };
  EXPECT_THROW(selfcheck::make_model_on_device(model_config_for(c), replica), FailedPrecondition);
  // The same failure on a single replica: the CPU, sized for the config's micro-batch.
  selfcheck::PlanOptions alone = replica;
  alone.allow_cpu_fallback = true;
  const selfcheck::ModelOnDevice made = selfcheck::make_model_on_device(model_config_for(c), alone);
  EXPECT_EQ(made.plan.device, "cpu");
  EXPECT_EQ(made.plan.why_cpu, "out of memory (test)");
  EXPECT_EQ(made.model->max_batch_size(), 2);
  EXPECT_EQ(made.model->max_seq_len(), 16);
}

}  // namespace
}  // namespace longhaul::trainer
