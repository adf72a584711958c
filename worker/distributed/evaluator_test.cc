// The evaluator replica in-process: a validation batch the model refuses (a token id outside the
// vocabulary) is a DataError naming the shard (exit 3), as it is for the trainer and `eval`.
#include "longhaul/distributed/evaluator.h"

#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "longhaul/data/data_loader.h"
#include "longhaul/data/token_shard.h"
#include "longhaul/model/cpu/gpt2_cpu.h"
#include "longhaul/supervisor/safetensors.h"
#include "longhaul/testing/temp_dir.h"
#include "longhaul/trainer/trainer.h"

namespace longhaul::dist {
namespace {

namespace fs = std::filesystem;

trainer::WorkerConfig small_config() {
  trainer::WorkerConfig c;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.model.context_length = 32;
  c.training.batch_size = 2;
  c.training.seq_len = 16;
  return c;
}

// A committed checkpoint of the small model at step 0 in `logdir`.
void write_checkpoint(const trainer::WorkerConfig& c, const fs::path& logdir) {
  auto data = data::TokenDataset::from_tokens("train", std::vector<uint16_t>(1000, 7));
  data::LoaderOptions o{.batch_size = c.training.batch_size, .seq_len = c.training.seq_len};
  trainer::Trainer t(c, model::make_cpu_gpt2(trainer::model_config_for(c), 2, 16),
                     std::make_unique<data::DataLoader>(data, o), nullptr);
  t.initialize();
  supervisor::Snapshot snap;
  t.snapshot(snap);
  supervisor::write_safetensors(logdir / "model.ckpt-0.safetensors", snap);
}

TEST(Evaluator, AValidationBatchTheModelRefusesIsADataErrorNamingItsShard) {
  const testing::TempDir dir("evaluator_test");
  trainer::WorkerConfig config = small_config();
  write_checkpoint(config, dir);
  std::vector<uint16_t> tokens(2 * 2 * 16 + 1, 5);
  tokens[40] = 60000;  // in the second batch; the vocabulary has 256 ids
  data::write_shard(dir / "val_000000.bin", tokens);
  config.data.val = (dir / "val_*.bin").string();

  EvaluatorOptions o;
  o.config = config;
  o.logdir = dir.path();
  o.poll_secs = 0.01;
  std::ostringstream progress;
  o.progress = &progress;
  try {
    run_evaluator(o);
    FAIL() << "the evaluator evaluated a token id beyond the vocabulary: " << progress.str();
  } catch (const trainer::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("val_000000.bin"), std::string::npos) << e.what();
  }
  EXPECT_EQ(progress.str(), "") << "no val_loss may be reported for a pass with a bad batch";
}

}  // namespace
}  // namespace longhaul::dist
