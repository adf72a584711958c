// The validation-loss loop shared by the trainer, `eval` and the evaluator: the mean over every
// batch of one pass (the same again after a reset), a batch the model refuses is a DataError
// naming its shard, and a stop abandons the pass.
#include "longhaul/trainer/validation.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "longhaul/model/cpu/gpt2_cpu.h"
#include "longhaul/trainer/trainer.h"

namespace longhaul::trainer {
namespace {

constexpr int kB = 2, kT = 8;

std::unique_ptr<model::LanguageModel> small_model() {
  const model::GPT2Config c{
      .vocab_size = 256, .context_length = 16, .n_layer = 1, .n_head = 2, .n_embd = 16};
  auto m = model::make_cpu_gpt2(c, kB, kT);
  m->init_weights(7);
  return m;
}

// `batches` batches' worth of token ids below 256, as one in-memory shard called `name`.
std::shared_ptr<const data::TokenDataset> tokens(const std::string& name, int batches) {
  std::vector<uint16_t> t(static_cast<size_t>(batches * kB * kT + 1));
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 37 + 11) % 256);
  return data::TokenDataset::from_tokens(name, std::move(t));
}

TEST(ValidationLoss, IsTheMeanOverEveryBatchOfOnePass) {
  auto model = small_model();
  data::EvalLoader val(tokens("val", 3), data::LoaderOptions{.batch_size = kB, .seq_len = kT});
  ASSERT_EQ(val.num_batches(), 3);
  double sum = 0;
  data::Batch batch;
  std::vector<int32_t> inputs, targets;
  while (val.next(batch)) {
    batch.to_int32(inputs, targets);
    sum += model->forward_loss(inputs.data(), targets.data(), kB, kT);
  }

  const ValidationLoss first = validation_loss(*model, val, kB, kT);  // resets `val` first
  EXPECT_EQ(first.batches, 3);
  EXPECT_FALSE(first.stopped);
  EXPECT_NEAR(first.mean_loss, sum / 3, 1e-6);
  const ValidationLoss again = validation_loss(*model, val, kB, kT);
  EXPECT_EQ(again.batches, 3);
  EXPECT_EQ(again.mean_loss, first.mean_loss);
}

TEST(ValidationLoss, ABatchTheModelRefusesIsADataErrorNamingItsShard) {
  auto model = small_model();
  std::vector<uint16_t> t(2 * kB * kT + 1, 5);
  t[kB * kT + 3] = 300;  // in the second batch, outside the vocabulary of 256
  data::EvalLoader val(data::TokenDataset::from_tokens("val_000001.bin", std::move(t)),
                       data::LoaderOptions{.batch_size = kB, .seq_len = kT});
  try {
    validation_loss(*model, val, kB, kT);
    FAIL() << "a token id beyond the vocabulary was evaluated";
  } catch (const DataError& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("bad validation batch from val_000001.bin"),
              std::string::npos)
        << e.what();
  }
}

TEST(ValidationLoss, AStopAbandonsThePassWithTheBatchesDoneSoFar) {
  auto model = small_model();
  data::EvalLoader val(tokens("val", 3), data::LoaderOptions{.batch_size = kB, .seq_len = kT});
  int asked = 0;
  const ValidationLoss r = validation_loss(*model, val, kB, kT, [&] { return ++asked > 1; });
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.batches, 1);
  EXPECT_EQ(asked, 2);
}

}  // namespace
}  // namespace longhaul::trainer
