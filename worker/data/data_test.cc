// Token shards, loaders and prepare-data: format, errors naming the file, deterministic and
// resumable order, rank sharding, eval pass.
#include <cstring>
#include <fstream>
#include <functional>
#include <set>

#include <gtest/gtest.h>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/data/data_loader.h"
#include "longhaul/data/prepare.h"
#include "longhaul/data/token_shard.h"
#include "longhaul/testing/temp_dir.h"

namespace longhaul::data {
namespace {

namespace fs = std::filesystem;

class DataTest : public ::testing::Test {
 protected:
  longhaul::testing::TempDir tmp_{"longhaul_data_test"};
  const fs::path dir_ = tmp_.path();

  static std::vector<uint16_t> iota(size_t n, uint16_t start = 0) {
    std::vector<uint16_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(start + i);
    return v;
  }
};

template <typename E>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "<no error>";
}

TEST_F(DataTest, ShardRoundTripsAndHasTheLlmcHeader) {
  const auto tokens = iota(1000, 7);
  write_shard(dir_ / "a.bin", tokens);
  const std::string bytes = file::read_file(dir_ / "a.bin");
  ASSERT_EQ(bytes.size(), 1024u + 2000u);
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 1000);
  TokenShard shard(dir_ / "a.bin");
  ASSERT_EQ(shard.size(), 1000u);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), shard.tokens().begin()));
}

TEST_F(DataTest, WrongMagicNamesTheFile) {
  write_shard(dir_ / "bad.bin", iota(10));
  std::fstream f(dir_ / "bad.bin", std::ios::in | std::ios::out | std::ios::binary);
  int32_t magic = 12345;
  f.write(reinterpret_cast<const char*>(&magic), 4);
  f.close();
  const std::string msg = error_of<InvalidArgument>([&] { TokenShard s(dir_ / "bad.bin"); });
  EXPECT_NE(msg.find((dir_ / "bad.bin").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("magic 12345"), std::string::npos) << msg;
}

TEST_F(DataTest, WrongVersionIsRefused) {
  write_shard(dir_ / "v.bin", iota(10));
  std::fstream f(dir_ / "v.bin", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(4);
  int32_t version = 2;
  f.write(reinterpret_cast<const char*>(&version), 4);
  f.close();
  EXPECT_NE(error_of<InvalidArgument>([&] { TokenShard s(dir_ / "v.bin"); }).find("version 2"),
            std::string::npos);
}

TEST_F(DataTest, TruncatedShardNamesTheFileAndTheCounts) {
  write_shard(dir_ / "t.bin", iota(100));
  fs::resize_file(dir_ / "t.bin", 1024 + 150);
  const std::string msg = error_of<DataLoss>([&] { TokenShard s(dir_ / "t.bin"); });
  EXPECT_NE(msg.find("t.bin is truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("100 tokens"), std::string::npos) << msg;
  fs::resize_file(dir_ / "t.bin", 10);
  EXPECT_NE(error_of<DataLoss>([&] { TokenShard s(dir_ / "t.bin"); }).find("header"),
            std::string::npos);
}

TEST_F(DataTest, GlobIsSortedAndEmptyGlobIsNotFound) {
  write_shard(dir_ / "train_000002.bin", iota(10));
  write_shard(dir_ / "train_000000.bin", iota(10));
  write_shard(dir_ / "train_000001.bin", iota(10));
  auto files = expand_glob((dir_ / "train_*.bin").string());
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].filename(), "train_000000.bin");
  EXPECT_EQ(files[2].filename(), "train_000002.bin");
  EXPECT_NE(
      error_of<NotFound>([&] { expand_glob((dir_ / "val_*.bin").string()); }).find("val_*.bin"),
      std::string::npos);
}

std::vector<std::vector<uint16_t>> take(DataLoader& loader, int n) {
  std::vector<std::vector<uint16_t>> out;
  for (int i = 0; i < n; ++i) {
    Batch b = loader.next();
    out.emplace_back(b.tokens.begin(), b.tokens.end());
  }
  return out;
}

TEST_F(DataTest, BatchIsInputsAndShiftedTargets) {
  auto ds = TokenDataset::from_tokens("mem", iota(100));
  DataLoader loader(ds, {.batch_size = 2, .seq_len = 4, .seed = 1, .shuffle = false});
  Batch b = loader.next();
  ASSERT_EQ(b.tokens.size(), 9u);
  std::vector<int32_t> in, tgt;
  b.to_int32(in, tgt);
  EXPECT_EQ(in, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(tgt, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(loader.next().tokens[0], 8);  // sequential
}

// A SIGTERM while a glob of many shards is opened ends the opening before the next shard, not
// after the last one.
TEST_F(DataTest, FromGlobStopsBetweenShardsWhenAStopIsRequested) {
  for (int i = 0; i < 3; ++i) write_shard(dir_ / ("s" + std::to_string(i) + ".bin"), iota(20));
  int asked = 0;
  try {
    TokenDataset::from_glob((dir_ / "s*.bin").string(), [&] { return ++asked == 2; });
    FAIL() << "opening went on after a stop request";
  } catch (const Cancelled& e) {
    EXPECT_NE(std::string(e.what()).find("after 1 of 3 shards"), std::string::npos) << e.what();
  }
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(TokenDataset::from_glob((dir_ / "s*.bin").string(), [] { return false; })->num_parts(),
            3u);
}

TEST_F(DataTest, ShuffledOrderVisitsEverySlotOncePerEpochAndWraps) {
  write_shard(dir_ / "s0.bin", iota(81, 0));     // 10 slots of 8
  write_shard(dir_ / "s1.bin", iota(41, 1000));  // 5 slots
  write_shard(dir_ / "s2.bin", iota(5, 2000));   // too small: skipped
  auto ds = TokenDataset::from_glob((dir_ / "s*.bin").string());
  DataLoader loader(ds, {.batch_size = 2, .seq_len = 4, .seed = 42});
  EXPECT_EQ(loader.batches_per_epoch(), 15);
  auto epoch0 = take(loader, 15);
  std::set<uint16_t> firsts;
  for (const auto& b : epoch0) firsts.insert(b[0]);
  EXPECT_EQ(firsts.size(), 15u);
  EXPECT_EQ(loader.position().epoch, 1);
  auto epoch1 = take(loader, 15);
  EXPECT_NE(epoch0, epoch1) << "a new epoch reshuffles";
  std::set<uint16_t> firsts1;
  for (const auto& b : epoch1) firsts1.insert(b[0]);
  EXPECT_EQ(firsts, firsts1);
  // Same seed, same order; another seed, another order.
  DataLoader again(ds, {.batch_size = 2, .seq_len = 4, .seed = 42});
  EXPECT_EQ(take(again, 15), epoch0);
  DataLoader other(ds, {.batch_size = 2, .seq_len = 4, .seed = 43});
  EXPECT_NE(take(other, 15), epoch0);
}

TEST_F(DataTest, PositionResumesTheExactSequence) {
  auto ds = TokenDataset::from_tokens("mem", iota(2000));
  LoaderOptions o{.batch_size = 3, .seq_len = 5, .seed = 9};
  DataLoader a(ds, o);
  take(a, 200);  // crosses epochs (133 slots per epoch)
  const std::string pos = a.position_json();
  auto expected = take(a, 150);
  DataLoader b(ds, o);
  b.restore(pos);
  EXPECT_EQ(take(b, 150), expected);

  LoaderOptions changed = o;
  changed.batch_size = 4;
  DataLoader c(ds, changed);
  EXPECT_NE(error_of<FailedPrecondition>([&] { c.restore(pos); }).find("batch_tokens"),
            std::string::npos);
  EXPECT_THROW(c.restore("not json"), InvalidArgument);
}

TEST_F(DataTest, RanksReadDisjointWindows) {
  auto ds = TokenDataset::from_tokens("mem", iota(1000));
  std::set<uint16_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    DataLoader loader(ds,
                      {.batch_size = 2, .seq_len = 4, .seed = 5, .rank = rank, .world_size = 3});
    EXPECT_EQ(loader.batches_per_epoch(), 41);
    for (const auto& b : take(loader, 41)) EXPECT_TRUE(seen.insert(b[0]).second) << b[0];
  }
  EXPECT_EQ(seen.size(), 123u);
}

TEST_F(DataTest, DataTooSmallForOneBatchSaysWhatItNeeds) {
  auto ds = TokenDataset::from_tokens("tiny-data", iota(8));
  const std::string msg =
      error_of<InvalidArgument>([&] { DataLoader l(ds, {.batch_size = 2, .seq_len = 4}); });
  EXPECT_NE(msg.find("tiny-data"), std::string::npos) << msg;
  EXPECT_NE(msg.find("= 9 tokens"), std::string::npos) << msg;
}

TEST_F(DataTest, EvalLoaderMakesOneSequentialPass) {
  auto ds = TokenDataset::from_tokens("mem", iota(100));
  EvalLoader all(ds, {.batch_size = 2, .seq_len = 4});
  EXPECT_EQ(all.num_batches(), 12);
  Batch b;
  int n = 0;
  while (all.next(b)) EXPECT_EQ(b.tokens[0], 8 * n++);
  EXPECT_EQ(n, 12);
  EXPECT_FALSE(all.next(b));
  all.reset();
  EXPECT_TRUE(all.next(b));
  EvalLoader limited(ds, {.batch_size = 2, .seq_len = 4}, 3);
  EXPECT_EQ(limited.num_batches(), 3);
}

TEST_F(DataTest, PrepareDataSplitsBytesIntoShards) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += "line " + std::to_string(i) + " \xc3\xa9\n";
  { std::ofstream(dir_ / "in.txt") << text; }
  fs::create_directories(dir_ / "out");
  write_shard(dir_ / "out" / "train_000009.bin", iota(3));  // stale, from an earlier run
  PrepareOptions o{.inputs = {dir_ / "in.txt"},
                   .output_dir = dir_ / "out",
                   .val_fraction = 0.1,
                   .shard_tokens = 4000};
  PrepareResult r = prepare_text_shards(o);
  EXPECT_EQ(r.train_tokens + r.val_tokens, text.size());
  EXPECT_EQ(r.val_tokens, text.size() / 10);
  EXPECT_EQ(r.train_shards.size(), (r.train_tokens + 3999) / 4000);
  EXPECT_FALSE(fs::exists(dir_ / "out" / "train_000009.bin"));
  std::string round_trip;
  for (const auto& p : r.train_shards) {
    TokenShard s(p);
    for (uint16_t t : s.tokens()) round_trip.push_back(static_cast<char>(t));
  }
  TokenShard val(r.val_shards.at(0));
  for (uint16_t t : val.tokens()) round_trip.push_back(static_cast<char>(t));
  EXPECT_EQ(round_trip, text);
  EXPECT_THROW(prepare_text_shards({.inputs = {dir_ / "missing.txt"}, .output_dir = dir_}),
               NotFound);
  EXPECT_THROW(
      prepare_text_shards({.inputs = {dir_ / "in.txt"}, .output_dir = dir_, .val_fraction = 1.5}),
      InvalidArgument);
}

TEST_F(DataTest, PrepareDataRecordsItsTokenizerForTraining) {
  { std::ofstream(dir_ / "in.txt") << "some text for the manifest"; }
  prepare_text_shards({.inputs = {dir_ / "in.txt"}, .output_dir = dir_ / "out", .val_fraction = 0});
  auto m = read_data_manifest((dir_ / "out" / "train_*.bin").string());
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->tokenizer, "bytes");
  EXPECT_EQ(m->vocab_size, 256);
  // No manifest (e.g. llm.c's own shards): nothing to say; a garbled one: an error naming it.
  fs::remove(dir_ / "out" / std::string(kDataManifestName));
  EXPECT_FALSE(read_data_manifest((dir_ / "out" / "train_*.bin").string()).has_value());
  { std::ofstream(dir_ / "out" / std::string(kDataManifestName)) << "{\"tokenizer\": 3"; }
  try {
    read_data_manifest((dir_ / "out" / "train_*.bin").string());
    ADD_FAILURE() << "no error for a garbled manifest";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("longhaul-data.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(prepare_text_shards(
                   {.inputs = {dir_ / "in.txt"}, .tokenizer = "gpt2", .output_dir = dir_ / "out2"}),
               InvalidArgument);  // gpt2 needs its files
}

TEST_F(DataTest, EmbeddedCorpusIsLargeTextAndSplits) {
  const std::string_view corpus = embedded_corpus();
  EXPECT_GT(corpus.size(), 1'000'000u);
  EXPECT_NE(corpus.find("Story 1:"), std::string_view::npos);
  EXPECT_NE(corpus.find("longhaul"), std::string_view::npos);
  auto train = embedded_dataset(false);
  auto val = embedded_dataset(true);
  EXPECT_EQ(train->total_tokens() + val->total_tokens(), corpus.size());
  EXPECT_GT(val->total_tokens(), 10'000u);
}

}  // namespace
}  // namespace longhaul::data
