// End-to-end tests of longhaul-worker: each bad input gets its clear error and exit code and
// leaves earlier checkpoints intact; exact resume after SIGTERM; corrupt-latest fallback;
// pre-trained init; eval, inspect and prepare-data output; metrics over HTTP.
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include "longhaul/data/token_shard.h"
#include "longhaul/supervisor/safetensors.h"
#include "longhaul/testing/loopback.h"
#include "longhaul/testing/test_temp_dir.h"
#include "worker_process.h"

namespace longhaul::worker_test {
namespace {

using namespace std::chrono_literals;
using supervisor::SafetensorsReader;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Every file of a logdir that must survive a failed run unchanged: checkpoints + state file.
std::map<std::string, std::string> checkpoint_bytes(const fs::path& logdir) {
  std::map<std::string, std::string> out;
  for (const auto& [step, path] : checkpoint_files(logdir)) {
    out[path.filename().string()] = read_text(path);
  }
  out["checkpoint"] = read_text(logdir / "checkpoint");
  return out;
}

class WorkerCliTest : public ::testing::Test {
 protected:
  void SetUp() override { write_text(dir_ / "small.yaml", small_model_config(10, 5)); }

  // Trains the small model for 10 steps into `logdir` (checkpoints at 5 and 10).
  void train_good_logdir(const fs::path& logdir) {
    RunOutput r =
        run_worker({"train", "--config", "small.yaml", "--logdir", logdir.string()}, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    ASSERT_EQ(state_file_latest_step(logdir), 10);
    ASSERT_EQ(checkpoint_files(logdir).size(), 2u);
  }

  longhaul::testing::TestTempDir dir_{"worker_cli"};
};

TEST_F(WorkerCliTest, HelpAndVersion) {
  RunOutput r = run_worker({"--help"}, dir_);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(contains(r.out, "prepare-data")) << r.out;
  for (const char* cmd : {"train", "eval", "inspect", "prepare-data"}) {
    RunOutput h = run_worker({cmd, "--help"}, dir_);
    EXPECT_EQ(h.exit_code, 0) << cmd;
    EXPECT_TRUE(contains(h.out, "Usage")) << h.out;
  }
  RunOutput v = run_worker({"--version"}, dir_);
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_TRUE(contains(v.out, "longhaul-worker 0.")) << v.out;
  EXPECT_EQ(run_worker({"train", "--no-such-flag"}, dir_).exit_code, 2);
  EXPECT_EQ(run_worker({}, dir_).exit_code, 2);
}

TEST_F(WorkerCliTest, TrainsPrintsProgressAndResumes) {
  RunOutput r = run_worker({"train", "--config", "small.yaml", "--logdir", "run"}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(start_step(r.out), 0);
  EXPECT_TRUE(contains(r.out, "step     10/10 | loss ")) << r.out;
  EXPECT_TRUE(contains(r.out, "tok/s | eta ")) << r.out;
  // Again with more steps: resumes at 10.
  RunOutput again = run_worker(
      {"train", "--config", "small.yaml", "--logdir", "run", "--set", "training.max_steps=12"},
      dir_);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(contains(again.out, "resuming at step 10/12")) << again.out;
  EXPECT_EQ(state_file_latest_step(dir_ / "run"), 12);
  // Gradient accumulation: 96 tokens per step = 3 micro-batches of 2 x 16.
  RunOutput accumulated = run_worker({"train", "--config", "small.yaml", "--logdir", "acc", "--set",
                                      "training.total_batch_tokens=96"},
                                     dir_);
  ASSERT_EQ(accumulated.exit_code, 0) << accumulated.err;
  EXPECT_TRUE(contains(accumulated.out, "96 tokens/step (3 micro-batches of 2x16)"))
      << accumulated.out;
  RunOutput not_multiple = run_worker({"train", "--config", "small.yaml", "--logdir", "acc2",
                                       "--set", "training.total_batch_tokens=100"},
                                      dir_);
  EXPECT_EQ(not_multiple.exit_code, 2);
  EXPECT_TRUE(contains(not_multiple.err, "training.total_batch_tokens 100 must be a multiple"))
      << not_multiple.err;
}

// The operator's final status of a job comes from here (worker/cli/termination_message.h): a
// job that trained 1,500 of 1,500 steps once ended showing the step of its last metrics read.
TEST_F(WorkerCliTest, LeavesItsFinalProgressInTheTerminationMessage) {
  const fs::path message = dir_ / "termination-log";
  RunOutput r = run_worker({"train", "--config", "small.yaml", "--logdir", "run"}, dir_, 120s,
                           {{"LONGHAUL_TERMINATION_MESSAGE_PATH", message.string()}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(read_text(message));
  EXPECT_EQ(j["step"], 10) << j;
  EXPECT_EQ(j["maxSteps"], 10) << j;
  EXPECT_EQ(j["lastCheckpointStep"], 10) << j;
  EXPECT_EQ(j["chief"], true) << j;
  EXPECT_TRUE(j["lastCheckpointTime"].is_string() && j["lastStepTime"].is_string()) << j;
  EXPECT_GT(j["stepsPerSecond"].get<double>(), 0) << j;
  EXPECT_LE(read_text(message).size(), 4096u) << "the kubelet keeps at most 4096 bytes";

  // A path that cannot be written (its folder is missing, or it is a folder) never fails the
  // worker: it says so in its log and finishes.
  for (const fs::path& bad : {dir_ / "no-such-dir" / "termination-log", dir_.path()}) {
    RunOutput unwritable = run_worker(
        {"train", "--config", "small.yaml", "--logdir", "run", "--set", "training.max_steps=12"},
        dir_, 120s, {{"LONGHAUL_TERMINATION_MESSAGE_PATH", bad.string()}});
    EXPECT_EQ(unwritable.exit_code, 0) << unwritable.err;
    EXPECT_TRUE(
        contains(unwritable.err + unwritable.out, "could not write the termination message"))
        << unwritable.err;
  }
}

TEST_F(WorkerCliTest, LogdirComesFromFlagThenEnvironmentThenConfig) {
  write_text(dir_ / "with_logdir.yaml", small_model_config(2, 0) + "logdir: from_config\n");
  ASSERT_EQ(run_worker({"train", "--config", "with_logdir.yaml"}, dir_).exit_code, 0);
  EXPECT_EQ(state_file_latest_step(dir_ / "from_config"), 2);
  ASSERT_EQ(run_worker({"train", "--config", "with_logdir.yaml"}, dir_, 120s,
                       {{"LONGHAUL_LOGDIR", "from_env"}})
                .exit_code,
            0);
  EXPECT_EQ(state_file_latest_step(dir_ / "from_env"), 2);
  ASSERT_EQ(run_worker({"train", "--config", "with_logdir.yaml", "--logdir", "from_flag"}, dir_,
                       120s, {{"LONGHAUL_LOGDIR", "from_env2"}})
                .exit_code,
            0);
  EXPECT_EQ(state_file_latest_step(dir_ / "from_flag"), 2);
  EXPECT_FALSE(fs::exists(dir_ / "from_env2"));
}

struct BadInput {
  std::string name;
  std::vector<std::string> args;  // appended to train --logdir good
  int exit_code;
  std::vector<std::string> messages;  // each must appear in stderr
};

TEST_F(WorkerCliTest, EachBadInputHasItsErrorAndLeavesCheckpointsIntact) {
  const fs::path good = dir_ / "good";
  train_good_logdir(good);
  const auto before = checkpoint_bytes(good);

  write_text(dir_ / "garbled.yaml", "training: {batch_size: 4\nmodel: [\n");
  write_text(dir_ / "unknown.yaml", "training:\n  bach_size: 4\n");
  write_text(dir_ / "badvalue.yaml", "training:\n  batch_size: many\n");
  std::vector<uint16_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 256);
  fs::create_directories(dir_ / "magic");
  data::write_shard(dir_ / "magic" / "train_000000.bin", tokens);
  {
    std::fstream f(dir_ / "magic" / "train_000000.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    const int32_t wrong = 20240519;
    f.write(reinterpret_cast<const char*>(&wrong), 4);
  }
  fs::create_directories(dir_ / "trunc");
  data::write_shard(dir_ / "trunc" / "train_000000.bin", tokens);
  fs::resize_file(dir_ / "trunc" / "train_000000.bin", 1024 + 2 * 4000);
  write_text(dir_ / "not_a_dir", "a file where the logdir's parent should be");

  const std::vector<BadInput> cases = {
      {"missing config", {"--config", "nope.yaml"}, 2, {"nope.yaml"}},
      {"garbled config", {"--config", "garbled.yaml"}, 2, {"garbled.yaml is not valid YAML"}},
      {"unknown key",
       {"--config", "unknown.yaml"},
       2,
       {"unknown.yaml", "unknown key 'training.bach_size'", "did you mean 'training.batch_size'"}},
      {"bad value", {"--config", "badvalue.yaml"}, 2, {"training.batch_size must be an integer"}},
      {"unknown --set key",
       {"--config", "small.yaml", "--set", "training.max_step=3"},
       2,
       {"training.max_step", "did you mean 'training.max_steps'"}},
      {"wrong shard magic",
       {"--config", "small.yaml", "--set", "data.train=magic/train_*.bin"},
       3,
       {"magic/train_000000.bin", "magic 20240519", "20240520"}},
      {"truncated shard",
       {"--config", "small.yaml", "--set", "data.train=trunc/train_*.bin"},
       3,
       {"trunc/train_000000.bin is truncated", "5000 tokens"}},
      {"no shard matches",
       {"--config", "small.yaml", "--set", "data.train=none/train_*.bin"},
       3,
       {"none/train_*.bin", "matches no files"}},
      {"checkpoint of another shape",
       {"--config", "small.yaml", "--set", "model.n_embd=64"},
       4,
       {"transformer.wte.weight", "[256, 32]", "[256, 64]", "model.ckpt-10.safetensors"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> args{"train", "--logdir", good.string()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    RunOutput r = run_worker(args, dir_);
    EXPECT_EQ(r.exit_code, c.exit_code) << r.out << r.err;
    for (const auto& m : c.messages) EXPECT_TRUE(contains(r.err, m)) << m << "\n" << r.err;
    EXPECT_EQ(checkpoint_bytes(good), before) << "checkpoints changed";
  }

  // Unwritable logdir: its parent is a regular file.
  RunOutput r = run_worker(
      {"train", "--config", "small.yaml", "--logdir", (dir_ / "not_a_dir" / "logdir").string()},
      dir_);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "not_a_dir/logdir")) << r.err;
  EXPECT_EQ(checkpoint_bytes(good), before);
}

// Flips one byte inside the data of a checkpoint (past the header).
void corrupt(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-100, std::ios::end);
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(-100, std::ios::end);
  f.write(&c, 1);
}

TEST_F(WorkerCliTest, CorruptLatestCheckpointFallsBackToThePreviousWithAWarning) {
  const fs::path logdir = dir_ / "run";
  train_good_logdir(logdir);
  corrupt(logdir / "model.ckpt-10.safetensors");
  const std::string five = read_text(logdir / "model.ckpt-5.safetensors");
  RunOutput r = run_worker(
      {"train", "--config", "small.yaml", "--logdir", "run", "--set", "training.max_steps=8"},
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "resuming at step 5/8")) << r.out;
  EXPECT_TRUE(contains(r.err, "WARN")) << r.err;
  EXPECT_TRUE(contains(r.err, "model.ckpt-10.safetensors")) << r.err;
  EXPECT_EQ(read_text(logdir / "model.ckpt-5.safetensors"), five);
  EXPECT_EQ(state_file_latest_step(logdir), 8);
}

// Flips one bit of the first digit of metadata value `key` in a checkpoint's header.
void flip_metadata_digit(const fs::path& file, const std::string& key) {
  std::string bytes = read_text(file);
  const size_t at = bytes.find("\"" + key + "\":\"");
  ASSERT_NE(at, std::string::npos) << key;
  const size_t digit = bytes.find_first_of("0123456789", at + key.size() + 4);
  ASSERT_NE(digit, std::string::npos);
  bytes[digit] = static_cast<char>(bytes[digit] ^ 0x01);
  write_text(file, bytes);
}

// Regression: one flipped bit in the `step` metadata made the worker restore "step 11 of 10"
// and finish; in `data_position` it exited 2 (a config error) while `inspect` said that
// checkpoint would be restored. Metadata is checksummed: a flip is corruption, `train` falls
// back to the previous checkpoint, and `inspect` (the same code path) says so.
TEST_F(WorkerCliTest, FlippedMetadataBitFallsBackToThePreviousCheckpointInTrainAndInspect) {
  for (const std::string key : {"step", "data_position"}) {
    SCOPED_TRACE(key);
    const fs::path logdir = dir_ / ("run-" + key);
    train_good_logdir(logdir);
    flip_metadata_digit(logdir / "model.ckpt-10.safetensors", key);
    RunOutput inspect = run_worker({"inspect", logdir.string(), "--json"}, dir_);
    ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
    const auto j = nlohmann::json::parse(inspect.out);
    EXPECT_EQ(j["restore"]["step"], 5) << inspect.out;
    EXPECT_EQ(j["skipped"], nlohmann::json::array({"model.ckpt-10.safetensors"}));
    RunOutput r = run_worker({"train", "--config", "small.yaml", "--logdir", logdir.string(),
                              "--set", "training.max_steps=8"},
                             dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(contains(r.out, "resuming at step 5/8")) << r.out;
    EXPECT_TRUE(contains(r.err, "metadata_crc32c")) << r.err;
  }
}

// Regression: a FIFO or a device given as a config or named like a checkpoint blocked `train`
// and `inspect` forever (/dev/zero grew memory at ~1 GB/s); unclear messages named no key/file.
TEST_F(WorkerCliTest, NonRegularFilesAndUnclearInputsGetAClearErrorNamingTheKeyOrFile) {
  ASSERT_EQ(::mkfifo((dir_ / "fifo.yaml").c_str(), 0644), 0);
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"train", "--config", "fifo.yaml", "--logdir", "x"}, 2, "is a FIFO, not a regular file"},
      {{"train", "--config", "/dev/zero", "--logdir", "x"}, 2, "is a character device"},
      {{"train", "--config", "small.yaml", "--logdir", "x", "--set", "model.context_length=1"},
       2,
       "training.seq_len 16 exceeds model.context_length 1"},
      {{"eval", "--checkpoint", dir_.path().string(), "--data", "nothing*.bin"},
       4,
       "is a directory"},
  };
  for (const Case& c : cases) {
    RunOutput r = run_worker(c.args, dir_, 60s);
    EXPECT_EQ(r.exit_code, c.code) << c.args[2] << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, c.expect)) << r.err;
  }
  // A FIFO named like a checkpoint is skipped, not waited on.
  const fs::path logdir = dir_ / "run";
  train_good_logdir(logdir);
  ASSERT_EQ(::mkfifo((logdir / "model.ckpt-20.safetensors").c_str(), 0644), 0);
  RunOutput inspect = run_worker({"inspect", logdir.string(), "--json"}, dir_, 60s);
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_EQ(nlohmann::json::parse(inspect.out)["restore"]["step"], 10) << inspect.out;
  // Every checkpoint corrupt: inspect says the restart would fail, as train does (exit 4).
  corrupt(logdir / "model.ckpt-5.safetensors");
  corrupt(logdir / "model.ckpt-10.safetensors");
  RunOutput all_bad = run_worker({"inspect", logdir.string()}, dir_, 60s);
  EXPECT_TRUE(contains(all_bad.out, "a restart would FAIL (exit 4)")) << all_bad.out;
  RunOutput train = run_worker({"train", "--config", "small.yaml", "--logdir", "run"}, dir_, 60s);
  EXPECT_EQ(train.exit_code, 4) << train.err;
}

// Flag values and eval shapes that cannot be used are refused with a message that names the flag
// or key and says what it takes (they printed a 300-digit bound, or were silently ignored), and
// nothing is written.
TEST_F(WorkerCliTest, BadFlagValuesAndEvalShapeMistakesAreNamedNotIgnored) {
  const fs::path logdir = dir_ / "run";
  train_good_logdir(logdir);
  const std::string ckpt = (logdir / "model.ckpt-10.safetensors").string();
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"train", "--config", "small.yaml", "--logdir", "x", "--metrics-port", "abc"},
       "--metrics-port: takes a TCP port from 1 to 65535, or 0 to turn the metrics server off, "
       "not 'abc'"},
      {{"prepare-data", "--input", "small.yaml", "--output-dir", "shards", "--shard-tokens", "0"},
       "--shard-tokens: takes a whole number of tokens per shard, at least 1"},
      {{"prepare-data", "--input", "small.yaml", "--output-dir", "shards", "--val-fraction", "1"},
       "--val-fraction: takes a fraction from 0 up to (not including) 1"},
      {{"eval", "--checkpoint", ckpt, "--data", "nothing*.bin", "--set", "model.n_layer=1"},
       "eval always uses the checkpoint's own shape: drop the model.* keys"},
      {{"eval", "--checkpoint", ckpt, "--data", "nothing*.bin", "--set", "training.seq_len=100000"},
       "training.seq_len = 100000 is longer than the model's context_length"},
  };
  for (const Case& c : cases) {
    RunOutput r = run_worker(c.args, dir_, 60s);
    EXPECT_EQ(r.exit_code, 2) << c.args[0] << " " << c.args.back() << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, c.expect)) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ / "x"));
  EXPECT_FALSE(fs::exists(dir_ / "shards"));
}

// Exact resume holds only in the same numerical environment: checkpoints record it, and a
// resume elsewhere (here: another thread count) says the continuation is equivalent, not
// bit-identical.
TEST_F(WorkerCliTest, ResumeInAnotherNumericalEnvironmentWarnsItIsNotBitIdentical) {
  const fs::path logdir = dir_ / "run";
  RunOutput a = run_worker({"train", "--config", "small.yaml", "--logdir", "run"}, dir_, 120s,
                           {{"LONGHAUL_NUM_THREADS", "1"}});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  SafetensorsReader r(logdir / "model.ckpt-10.safetensors");
  EXPECT_TRUE(contains(r.metadata().at("numerics"), "1 threads")) << r.metadata().at("numerics");
  RunOutput same = run_worker(
      {"train", "--config", "small.yaml", "--logdir", "run", "--set", "training.max_steps=12"},
      dir_, 120s, {{"LONGHAUL_NUM_THREADS", "1"}});
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_FALSE(contains(same.err, "not bit-identical")) << same.err;
  RunOutput other = run_worker(
      {"train", "--config", "small.yaml", "--logdir", "run", "--set", "training.max_steps=14"},
      dir_, 120s, {{"LONGHAUL_NUM_THREADS", "2"}});
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_TRUE(contains(other.err, "numerically equivalent, not bit-identical")) << other.err;
}

TEST_F(WorkerCliTest, SigtermWritesAFinalCheckpointAndResumeIsBitIdentical) {
  // Uninterrupted: 3000 steps (about a second: SIGTERM always lands mid-run), only the final
  // checkpoint.
  write_text(dir_ / "exact.yaml", small_model_config(3000, 0));
  RunOutput a = run_worker({"train", "--config", "exact.yaml", "--logdir", "a"}, dir_);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  // Interrupted: SIGTERM once step 100 is printed, then resume to 3000.
  {
    WorkerProcess b({"train", "--config", "exact.yaml", "--logdir", "b"}, dir_, dir_);
    ASSERT_TRUE(b.wait_for_stdout("step    100/3000", 60s)) << b.out() << b.err();
    b.signal(SIGTERM);
    ASSERT_EQ(b.wait(60s), 143) << b.err();
    EXPECT_TRUE(contains(b.err(), "SIGTERM")) << b.err();
  }
  const auto stopped_at = state_file_latest_step(dir_ / "b");
  ASSERT_TRUE(stopped_at.has_value());
  ASSERT_GE(*stopped_at, 100);
  ASSERT_LT(*stopped_at, 3000) << "the run ended before the signal; nothing was tested";
  RunOutput resumed = run_worker({"train", "--config", "exact.yaml", "--logdir", "b"}, dir_);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(start_step(resumed.out), *stopped_at);

  SafetensorsReader ra(dir_ / "a" / "model.ckpt-3000.safetensors");
  SafetensorsReader rb(dir_ / "b" / "model.ckpt-3000.safetensors");
  ASSERT_EQ(ra.tensor_names(), rb.tensor_names());
  for (const auto& name : ra.tensor_names()) {
    auto da = ra.data(name), db = rb.data(name);
    ASSERT_EQ(da.size(), db.size()) << name;
    EXPECT_EQ(std::memcmp(da.data(), db.data(), da.size()), 0) << name << " differs";
  }
  for (const char* key : {"step", "optimizer_step_count", "data_position", "train_tokens"}) {
    EXPECT_EQ(ra.metadata().at(key), rb.metadata().at(key)) << key;
  }
}

TEST_F(WorkerCliTest, SigintAlsoCheckpointsAndExits130) {
  write_text(dir_ / "long.yaml", small_model_config(100000, 0));
  WorkerProcess p({"train", "--config", "long.yaml", "--logdir", "run"}, dir_, dir_);
  ASSERT_TRUE(p.wait_for_stdout("step     20/", 60s)) << p.err();
  p.signal(SIGINT);
  ASSERT_EQ(p.wait(60s), 130) << p.err();
  const auto step = state_file_latest_step(dir_ / "run");
  ASSERT_TRUE(step.has_value());
  EXPECT_GE(*step, 20);
}

// Writes an HF-style GPT-2 safetensors file (no "transformer." prefix, attn.bias buffers, a tied
// lm_head) for the small model with deterministic values; returns the values by our name.
std::map<std::string, std::vector<float>> write_hf_file(const fs::path& path) {
  const int C = 32, V = 256, T = 32;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"wte.weight", {V, C}},
      {"wpe.weight", {T, C}},
      {"h.0.ln_1.weight", {C}},
      {"h.0.ln_1.bias", {C}},
      {"h.0.attn.bias", {1, 1, T, T}},
      {"h.0.attn.c_attn.weight", {C, 3 * C}},
      {"h.0.attn.c_attn.bias", {3 * C}},
      {"h.0.attn.c_proj.weight", {C, C}},
      {"h.0.attn.c_proj.bias", {C}},
      {"h.0.ln_2.weight", {C}},
      {"h.0.ln_2.bias", {C}},
      {"h.0.mlp.c_fc.weight", {C, 4 * C}},
      {"h.0.mlp.c_fc.bias", {4 * C}},
      {"h.0.mlp.c_proj.weight", {4 * C, C}},
      {"h.0.mlp.c_proj.bias", {C}},
      {"ln_f.weight", {C}},
      {"ln_f.bias", {C}},
      {"lm_head.weight", {V, C}},
  };
  std::vector<supervisor::TensorSpec> specs;
  std::vector<std::vector<float>> values;
  std::map<std::string, std::vector<float>> by_our_name;
  int k = 0;
  for (const auto& [name, shape] : shapes) {
    supervisor::TensorSpec spec{name, supervisor::DType::kF32, shape};
    std::vector<float> v(static_cast<size_t>(spec.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = 0.01f * static_cast<float>(std::sin(0.37 * static_cast<double>(i) + k));
    }
    ++k;
    if (name != "h.0.attn.bias" && name != "lm_head.weight") by_our_name["transformer." + name] = v;
    specs.push_back(spec);
    values.push_back(std::move(v));
  }
  std::vector<supervisor::TensorView> views;
  for (size_t i = 0; i < specs.size(); ++i) {
    views.push_back({&specs[i], std::as_bytes(std::span<const float>(values[i]))});
  }
  supervisor::write_safetensors(path, views, {{"format", "pt"}});
  return by_our_name;
}

TEST_F(WorkerCliTest, PretrainedInitOnlyWithoutACheckpoint) {
  const auto expected = write_hf_file(dir_ / "hf.safetensors");
  // A learning rate this small leaves the weights within 1e-6 of the pre-trained values.
  std::vector<std::string> args{"train",
                                "--config",
                                "small.yaml",
                                "--logdir",
                                "run",
                                "--set",
                                "checkpoint.init_from=hf.safetensors",
                                "--set",
                                "training.max_steps=1",
                                "--set",
                                "training.learning_rate=1e-9",
                                "--set",
                                "training.weight_decay=0"};
  RunOutput r = run_worker(args, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "initialised from hf.safetensors")) << r.out;
  {
    SafetensorsReader ckpt(dir_ / "run" / "model.ckpt-1.safetensors");
    for (const auto& [name, values] : expected) {
      auto bytes = ckpt.data(name);
      ASSERT_EQ(bytes.size(), values.size() * 4) << name;
      const float* got = reinterpret_cast<const float*>(bytes.data());
      for (size_t i = 0; i < values.size(); ++i) {
        ASSERT_NEAR(got[i], values[i], 1e-5) << name << "[" << i << "]";
      }
    }
  }
  // With a checkpoint present, init_from is not used: another file would change nothing.
  write_text(dir_ / "hf.safetensors", "garbage that would fail if it were read");
  args[8] = "training.max_steps=2";
  RunOutput again = run_worker(args, dir_);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(contains(again.out, "resuming at step 1/2")) << again.out;
  // A bad pre-trained file in a fresh logdir is a checkpoint error (4) naming it.
  args[4] = "fresh";
  RunOutput bad = run_worker(args, dir_);
  EXPECT_EQ(bad.exit_code, 4) << bad.err;
  EXPECT_TRUE(contains(bad.err, "hf.safetensors")) << bad.err;
}

TEST_F(WorkerCliTest, PrepareDataThenTrainEvalAndInspect) {
  std::string text;
  for (int i = 0; i < 2000; ++i)
    text += "The long haul train number " + std::to_string(i) + " left.\n";
  write_text(dir_ / "book.txt", text);
  RunOutput p = run_worker({"prepare-data", "--input", "book.txt", "--output-dir", "data",
                            "--val-fraction", "0.1", "--shard-tokens", "20000"},
                           dir_);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_TRUE(contains(p.out, "val shard")) << p.out;
  EXPECT_TRUE(fs::exists(dir_ / "data" / "train_000001.bin"));
  RunOutput t = run_worker({"train", "--config", "small.yaml", "--logdir", "run", "--set",
                            "data.train=data/train_*.bin", "--set", "data.val=data/val_*.bin",
                            "--set", "eval.every_steps=5", "--set", "eval.batches=3"},
                           dir_);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_TRUE(contains(t.out, "val_loss")) << t.out;

  // eval: text and JSON.
  RunOutput e = run_worker({"eval", "--checkpoint", "run/model.ckpt-10.safetensors", "--data",
                            "data/val_*.bin", "--config", "small.yaml"},
                           dir_);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_TRUE(contains(e.out, "(step 10): mean loss ")) << e.out;
  RunOutput ej = run_worker({"eval", "--checkpoint", "run/model.ckpt-10.safetensors", "--data",
                             "data/val_*.bin", "--config", "small.yaml", "--json"},
                            dir_);
  ASSERT_EQ(ej.exit_code, 0) << ej.err;
  auto j = nlohmann::json::parse(ej.out);
  EXPECT_EQ(j["step"], 10);
  EXPECT_GT(j["batches"].get<int>(), 0);
  const double loss = j["mean_loss"].get<double>();
  EXPECT_TRUE(std::isfinite(loss) && loss > 0 && loss < 6) << loss;  // below uniform ln(256)
  // eval errors: bad data 3, bad checkpoint 4.
  EXPECT_EQ(run_worker({"eval", "--checkpoint", "run/model.ckpt-10.safetensors", "--data",
                        "nothing_*.bin"},
                       dir_)
                .exit_code,
            3);
  fs::copy_file(dir_ / "run" / "model.ckpt-10.safetensors", dir_ / "broken.safetensors");
  corrupt(dir_ / "broken.safetensors");
  RunOutput eb =
      run_worker({"eval", "--checkpoint", "broken.safetensors", "--data", "data/val_*.bin"}, dir_);
  EXPECT_EQ(eb.exit_code, 4) << eb.err;
  EXPECT_TRUE(contains(eb.err, "broken.safetensors")) << eb.err;

  // inspect: corrupt the latest, a restart would restore the previous.
  corrupt(dir_ / "run" / "model.ckpt-10.safetensors");
  RunOutput i = run_worker({"inspect", "run"}, dir_);
  ASSERT_EQ(i.exit_code, 0) << i.err;
  EXPECT_TRUE(contains(i.out, "a restart would restore model.ckpt-5.safetensors (step 5)"))
      << i.out;
  EXPECT_TRUE(contains(i.out, "latest step: 10")) << i.out;
  EXPECT_TRUE(contains(i.out, "events.out.tfevents.")) << i.out;
  RunOutput ij = run_worker({"inspect", "run", "--json", "--tensors"}, dir_);
  ASSERT_EQ(ij.exit_code, 0) << ij.err;
  auto js = nlohmann::json::parse(ij.out);
  ASSERT_EQ(js["checkpoints"].size(), 2u);
  EXPECT_EQ(js["checkpoints"][0]["step"], 5);
  EXPECT_TRUE(js["checkpoints"][0]["valid"].get<bool>());
  EXPECT_FALSE(js["checkpoints"][1]["valid"].get<bool>());
  EXPECT_EQ(js["restore"]["step"], 5);
  EXPECT_EQ(js["restore"]["tensors"][0]["name"], "transformer.wte.weight");
  EXPECT_EQ(js["restore"]["tensors"][0]["shape"], nlohmann::json::array({256, 32}));
  EXPECT_EQ(js["events_files"].size(), 1u);
  EXPECT_EQ(run_worker({"inspect", "no_such_logdir"}, dir_).exit_code, 2);
}

TEST_F(WorkerCliTest, DeviceCudaWithoutAGpuIsAClearErrorAndWritesNothing) {
  // CUDA_VISIBLE_DEVICES="" hides every GPU, so this holds on GPU machines too.
  RunOutput r =
      run_worker({"train", "--config", "small.yaml", "--logdir", "run", "--set", "device=cuda"},
                 dir_, 120s, {{"CUDA_VISIBLE_DEVICES", ""}});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "small.yaml")) << r.err;
  EXPECT_TRUE(contains(r.err, "device cuda")) << r.err;
  EXPECT_TRUE(contains(r.err, "use device: cpu")) << r.err;
  EXPECT_FALSE(state_file_latest_step(dir_ / "run").has_value());
}

TEST_F(WorkerCliTest, DeviceAutoTrainsOnTheCpuWithAWarningWhenNoGpuCanRunTheModel) {
  // Hidden GPUs: the CPU, with a warning that says why and how to silence it.
  RunOutput hidden =
      run_worker({"train", "--config", "small.yaml", "--logdir", "hidden", "--set", "device=auto"},
                 dir_, 120s, {{"CUDA_VISIBLE_DEVICES", ""}});
  ASSERT_EQ(hidden.exit_code, 0) << hidden.out << hidden.err;
  EXPECT_TRUE(contains(hidden.err, "WARN")) << hidden.err;
  EXPECT_TRUE(contains(hidden.err, "device auto: no usable GPU, training on CPU")) << hidden.err;
  EXPECT_TRUE(contains(hidden.err, "device: cpu silences this")) << hidden.err;
  EXPECT_EQ(state_file_latest_step(dir_ / "hidden"), 10);

  // A shape the CUDA kernels refuse (n_embd and head size not multiples of 8). With a GPU this
  // is the GPU failing at start; without one, the warning names the missing GPU. Either way the
  // run trains on the CPU instead of failing.
  RunOutput odd = run_worker({"train", "--config", "small.yaml", "--logdir", "odd", "--set",
                              "device=auto", "--set", "model.n_embd=36", "--set", "model.n_head=3"},
                             dir_);
  ASSERT_EQ(odd.exit_code, 0) << odd.out << odd.err;
  EXPECT_TRUE(contains(odd.err, "device auto: no usable GPU, training on CPU")) << odd.err;
  EXPECT_EQ(state_file_latest_step(dir_ / "odd"), 10);
}

TEST_F(WorkerCliTest, ServesPrometheusMetricsWhileTraining) {
  write_text(dir_ / "long.yaml", small_model_config(100000, 50));
  // free_loopback_port() can lose a race with a parallel test that binds the same port between our
  // probe and the worker's bind; the worker then exits 1 naming the port. Retry with another port
  // then.
  int port = 0;
  std::unique_ptr<WorkerProcess> worker;
  for (int attempt = 0; attempt < 5; ++attempt) {
    port = testing::free_loopback_port();
    worker = std::make_unique<WorkerProcess>(
        std::vector<std::string>{"train", "--config", "long.yaml", "--logdir", "run",
                                 "--metrics-port", std::to_string(port)},
        dir_, dir_);
    if (worker->wait_for_stdout("step    100/", 60s)) break;
    const bool port_taken =
        !worker->running() && contains(worker->err(), "cannot serve Prometheus");
    ASSERT_TRUE(port_taken) << worker->err();
    worker.reset();
  }
  ASSERT_NE(worker, nullptr) << "no free metrics port after 5 attempts";
  WorkerProcess& p = *worker;
  std::string body;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  // Poll until a checkpoint has been counted (or the deadline passes).
  while ((body.empty() || contains(body, "longhaul_checkpoint_saves_total{rank=\"0\"} 0\n")) &&
         std::chrono::steady_clock::now() < deadline) {
    body = testing::http_get(port, "/metrics").body;
    std::this_thread::sleep_for(20ms);
  }
  for (const char* name :
       {"longhaul_train_global_step{rank=\"0\"}", "longhaul_train_steps_total{rank=\"0\"}",
        "longhaul_train_tokens_total{rank=\"0\"}",
        "longhaul_train_step_duration_seconds_bucket{rank=\"0\"", "longhaul_train_loss{rank=\"0\"}",
        "longhaul_checkpoint_last_step{rank=\"0\"}", "longhaul_checkpoint_saves_total{rank=\"0\"}",
        "longhaul_worker_is_chief{rank=\"0\"} 1", "longhaul_worker_build_info{"}) {
    EXPECT_TRUE(contains(body, name)) << name << "\n" << body;
  }
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait(60s), 143);
}

}  // namespace
}  // namespace longhaul::worker_test
