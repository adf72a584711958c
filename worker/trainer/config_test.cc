// Config loading: defaults, every kind of invalid input named with key and file, --set.
#include "longhaul/trainer/config.h"

#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>

#include "longhaul/base/error.h"
#include "longhaul/testing/temp_dir.h"

namespace longhaul::trainer {
namespace {

namespace fs = std::filesystem;

class ConfigTest : public ::testing::Test {
 protected:
  fs::path write(const std::string& text) {
    fs::path p = dir_ / "cfg.yaml";
    std::ofstream(p) << text;
    return p;
  }
  std::string error(const std::string& text, const std::vector<std::string>& sets = {}) {
    try {
      load_config(write(text), sets);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "<no error>";
  }
  longhaul::testing::TempDir dir_{"longhaul_config_test"};
};

TEST_F(ConfigTest, EmptyPathGivesTheEmbeddedDefault) {
  WorkerConfig c = load_config("");
  EXPECT_EQ(c.model.preset, "tiny");
  EXPECT_TRUE(c.data.train.empty());
  EXPECT_GT(c.training.max_steps, 0);
}

TEST_F(ConfigTest, ExampleTinyConfigDocumentsExactlyTheDefaults) {
  const char* source = std::getenv("LONGHAUL_SOURCE_DIR");
  if (source == nullptr) source = LONGHAUL_TEST_SOURCE_DIR;
  WorkerConfig example = load_config(fs::path(source) / "examples" / "worker-tiny.yaml");
  example.source.clear();
  EXPECT_EQ(to_yaml(example), to_yaml(load_config("")));
  EXPECT_NO_THROW(load_config(fs::path(source) / "examples" / "worker-small.yaml"));
}

TEST_F(ConfigTest, ReadsEverySection) {
  WorkerConfig c = load_config(write(R"(
model: {preset: tiny, n_layer: 2, n_embd: 64, n_head: 4}
data: {train: "d/train_*.bin", val: "d/val_*.bin", shuffle: false}
training: {batch_size: 2, seq_len: 16, total_batch_tokens: 64, max_steps: 7, learning_rate: 1e-3, seed: 9}
checkpoint:
  save_model_secs: 0
  save_model_steps: 5
  init_from: gpt2.safetensors
  init_name_map: {lm_head.weight: transformer.wte.weight}
summaries: {every_steps: 2}
eval: {every_steps: 3, batches: 4}
supervisor: {stop_grace_secs: 5}
device: cpu
metrics_port: 9100
)"));
  EXPECT_EQ(*c.model.n_layer, 2);
  EXPECT_EQ(c.data.val, "d/val_*.bin");
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.training.total_batch_tokens, 64);
  EXPECT_DOUBLE_EQ(c.training.learning_rate, 1e-3);
  EXPECT_EQ(c.checkpoint.save_model_steps, 5);
  EXPECT_EQ(c.checkpoint.init_name_map.at("lm_head.weight"), "transformer.wte.weight");
  EXPECT_EQ(c.metrics_port, 9100);
  EXPECT_DOUBLE_EQ(c.supervisor.stop_grace_secs, 5);
  // Round trip through to_yaml.
  fs::path again = dir_ / "again.yaml";
  std::ofstream(again) << to_yaml(c);
  WorkerConfig d = load_config(again);
  EXPECT_EQ(to_yaml(d), to_yaml(c));
}

TEST_F(ConfigTest, UnknownKeyNamesKeyAndFileWithSuggestion) {
  const std::string msg = error("training:\n  bach_size: 4\n");
  EXPECT_NE(msg.find("cfg.yaml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'training.bach_size'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'training.batch_size'"), std::string::npos) << msg;
  const std::string top = error("batch_size: 4\n");
  EXPECT_NE(top.find("did you mean 'training.batch_size'"), std::string::npos) << top;
  EXPECT_NE(error("modle: {}\n").find("did you mean 'model'"), std::string::npos);
}

// Regression: yaml-cpp kept the first of two equal keys silently (PyYAML and Helm take the last).
TEST_F(ConfigTest, DuplicateKeysAndSectionsAreRefusedNamingBothLines) {
  const std::string key = error("training:\n  batch_size: 4\n  seq_len: 8\n  batch_size: 2\n");
  EXPECT_NE(key.find("cfg.yaml"), std::string::npos) << key;
  EXPECT_NE(key.find("training.batch_size is given twice (lines 2 and 4)"), std::string::npos)
      << key;
  const std::string section =
      error("training:\n  batch_size: 4\nmodel: {}\ntraining:\n  seq_len: 8\n");
  EXPECT_NE(section.find("training is given twice (lines 1 and 4)"), std::string::npos) << section;
}

// Recovery in place (worker/distributed): the policy on a lost peer and how long survivors wait.
TEST_F(ConfigTest, PeerLossPolicyAndRegroupTimeoutAreValidated) {
  WorkerConfig c =
      load_config(write("supervisor: {on_peer_loss: regroup, regroup_timeout_secs: 45}\n"));
  EXPECT_EQ(c.supervisor.on_peer_loss, "regroup");
  EXPECT_DOUBLE_EQ(c.supervisor.regroup_timeout_secs, 45);
  const std::string policy = error("supervisor: {on_peer_loss: wait}\n");
  EXPECT_NE(policy.find("supervisor.on_peer_loss"), std::string::npos) << policy;
  EXPECT_NE(policy.find("regroup"), std::string::npos) << policy;
  EXPECT_NE(policy.find("exit"), std::string::npos) << policy;
  const std::string zero = error("supervisor: {regroup_timeout_secs: 0}\n");
  EXPECT_NE(zero.find("supervisor.regroup_timeout_secs"), std::string::npos) << zero;
}

// Regression: messages that named no key or told nothing useful.
TEST_F(ConfigTest, UnclearValueMessagesNameTheKeyAndWhatIsAllowed) {
  const std::string seed = error("training: {seed: -1}\n");
  EXPECT_NE(seed.find("training.seed must be a non-negative integer, got '-1'"), std::string::npos)
      << seed;
  const std::string secs = error("checkpoint: {save_model_secs: 1e300}\n");
  EXPECT_NE(secs.find("checkpoint.save_model_secs must be in [0, "), std::string::npos) << secs;
  const std::string section = error("", {"training=5"});
  EXPECT_NE(section.find("training is a section, not a key"), std::string::npos) << section;
  EXPECT_EQ(section.find("did you mean 'training'"), std::string::npos) << section;
}

TEST_F(ConfigTest, BadValuesNameTheKey) {
  struct Case {
    std::string yaml, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"training: {batch_size: abc}", "training.batch_size must be an integer, got 'abc'"},
           {"training: {batch_size: 0}", "training.batch_size must be in [1,"},
           {"training: {learning_rate: -1}", "training.learning_rate must be in (0"},
           {"training: {learning_rate: fast}", "training.learning_rate must be a number"},
           {"data: {shuffle: maybe}", "data.shuffle must be true or false"},
           {"device: tpu", "device must be one of auto, cpu, cuda, got 'tpu'"},
           {"model: {preset: huge}", "model.preset must be one of"},
           {"metrics_port: 70000", "metrics_port must be in [0, 65535]"},
           {"training: {batch_size: [1, 2]}", "training.batch_size must be a single value"},
           {"training: {batch_size: }", "training.batch_size has no value"},
           {"training: 5", "training must be a mapping"},
           {"training: {batch_size: 3, seq_len: 5, total_batch_tokens: 16}",
            "total_batch_tokens 16 must be a multiple of training.batch_size * training.seq_len = "
            "15"},
           {"checkpoint: {init_name_map: {a: b}}", "init_from is not"},
       }) {
    const std::string msg = error(c.yaml);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.yaml << "\n -> " << msg;
    EXPECT_NE(msg.find("cfg.yaml"), std::string::npos) << msg;
  }
}

TEST_F(ConfigTest, AllErrorsAreReportedTogether) {
  const std::string msg = error("training: {batch_size: x, seq_len: y}\n");
  EXPECT_NE(msg.find("training.batch_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("training.seq_len"), std::string::npos) << msg;
}

TEST_F(ConfigTest, MissingAndGarbledFilesNameTheFile) {
  try {
    load_config(dir_ / "nope.yaml");
    FAIL();
  } catch (const NotFound& e) {
    EXPECT_NE(std::string(e.what()).find("nope.yaml"), std::string::npos) << e.what();
  }
  const std::string msg = error("training: {batch_size: 4\nmodel: [\n");
  EXPECT_NE(msg.find("cfg.yaml is not valid YAML (line"), std::string::npos) << msg;
  EXPECT_NE(error("- a\n- b\n").find("must be a YAML mapping"), std::string::npos);
}

TEST_F(ConfigTest, SetOverridesFileValues) {
  WorkerConfig c = load_config(
      write("training: {batch_size: 4}\n"),
      {"training.batch_size=2", "data.train=d/*.bin", "checkpoint.init_from=x.safetensors",
       "checkpoint.init_name_map.lm_head.weight=transformer.wte.weight"});
  EXPECT_EQ(c.training.batch_size, 2);
  EXPECT_EQ(c.data.train, "d/*.bin");
  EXPECT_EQ(c.checkpoint.init_name_map.at("lm_head.weight"), "transformer.wte.weight");
  const std::string bad = error("", {"training.batch_size=abc"});
  EXPECT_NE(bad.find("--set training.batch_size: training.batch_size must be an integer"),
            std::string::npos)
      << bad;
  EXPECT_NE(error("", {"training.bach_size=1"}).find("did you mean 'training.batch_size'"),
            std::string::npos);
  EXPECT_NE(error("", {"novalue"}).find("expected key.sub=value"), std::string::npos);
}

}  // namespace
}  // namespace longhaul::trainer
