// Batches of tokens for training and evaluation, read from token shards (or from tokens held in
// memory, such as the embedded demo corpus).
//
// A batch is llm.c's: B*T+1 consecutive tokens; inputs are tokens[0, B*T) and targets are
// tokens[1, B*T+1), each viewed as B rows of T. A shard of n tokens holds
// floor((n-1) / (B*T*world_size)) batch slots per rank; slot k of rank r starts at token
// (k*world_size + r)*B*T, so ranks read disjoint windows.
//
// Training order (DataLoader): an epoch visits every shard once and every slot of a shard once.
// With shuffle on (the default), the shard order and the slot order inside each shard are
// permutations drawn from (seed, epoch[, shard]) with a fixed, portable generator (splitmix64 +
// Fisher-Yates), so every rank and every restart sees the same order. With shuffle off the order
// is sequential. Epochs wrap forever: next() never runs out. The position (epoch, shard, slot)
// serialises to a small JSON string; restoring it resumes the exact sequence of batches.
//
// Evaluation (EvalLoader): one sequential pass over the slots of every shard, then next() returns
// false until reset().
//
// Thread-safety: a loader is used by one thread at a time. TokenDataset is immutable and may be
// shared by any number of loaders.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "longhaul/data/token_shard.h"

namespace longhaul::data {

// An ordered list of token sequences ("parts": one per shard) that a loader draws batches from.
class TokenDataset {
 public:
  // Maps every file the glob matches, sorted by name. Throws what expand_glob/TokenShard throw.
  // `stop_requested` is asked before each shard (a glob may name thousands of shards on a slow
  // filesystem); when it says true, Cancelled is thrown and nothing stays mapped.
  static std::shared_ptr<const TokenDataset> from_glob(
      std::string_view pattern, const std::function<bool()>& stop_requested = {});
  // Holds `tokens` in memory as one part called `name`.
  static std::shared_ptr<const TokenDataset> from_tokens(std::string name,
                                                         std::vector<uint16_t> tokens);

  size_t num_parts() const { return parts_.size(); }
  const std::string& part_name(size_t i) const { return parts_[i].name; }
  std::span<const uint16_t> part_tokens(size_t i) const { return parts_[i].tokens; }
  uint64_t total_tokens() const;
  // Human-readable origin: the glob or the in-memory name.
  const std::string& description() const { return description_; }

 private:
  struct Part {
    std::string name;
    std::span<const uint16_t> tokens;
  };
  std::string description_;
  std::vector<Part> parts_;
  std::vector<std::unique_ptr<TokenShard>> shards_;
  std::vector<std::vector<uint16_t>> owned_;
};

struct LoaderOptions {
  int64_t batch_size = 4;  // B
  int64_t seq_len = 64;    // T
  uint64_t seed = 1337;
  bool shuffle = true;  // training only; evaluation is always sequential
  int rank = 0;
  int world_size = 1;
};

// A view of one batch: B*T+1 tokens, valid until the loader's next call or destruction.
struct Batch {
  std::span<const uint16_t> tokens;
  std::string_view source;  // the part (shard) it came from, for error messages

  // Copies inputs tokens[0, B*T) and targets tokens[1, B*T+1) as int32 (what the model takes).
  void to_int32(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const;
};

// The position of a DataLoader: the next batch is slot order[slot] of shard shard_order[shard]
// in `epoch`.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t shard = 0;
  int64_t slot = 0;
};

class DataLoader {
 public:
  // Throws InvalidArgument when options are out of range or when no shard holds even one batch
  // (naming the dataset, its token count and the B*T+1 a batch needs).
  DataLoader(std::shared_ptr<const TokenDataset> dataset, LoaderOptions options);

  // The next batch in the training order; wraps to the next epoch at the end. Never throws.
  Batch next();

  LoaderPosition position() const { return position_; }
  // {"epoch":E,"shard":S,"slot":K,"batch_tokens":B*T,"world_size":W,"seed":X,"shuffle":b,
  //  "parts":N} — the last five let restore() refuse a position taken with another layout.
  std::string position_json() const;
  // Resumes at a position from position_json(). Throws FailedPrecondition when it was taken with
  // a different batch size, world size, seed, shuffle or number of shards (naming both values),
  // InvalidArgument when the string is not such a position.
  void restore(std::string_view position_json);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  const LoaderOptions& options() const { return options_; }

 private:
  void start_epoch(int64_t epoch);
  void load_shard_order();
  void skip_empty_shards();

  std::shared_ptr<const TokenDataset> dataset_;
  LoaderOptions options_;
  std::vector<int64_t> slots_per_part_;
  int64_t batches_per_epoch_ = 0;
  LoaderPosition position_;
  std::vector<int64_t> shard_order_;  // permutation of parts for position_.epoch
  std::vector<int64_t> slot_order_;   // permutation of slots of the current shard
  int64_t slot_order_for_ = -1;       // shard index slot_order_ was built for
};

class EvalLoader {
 public:
  // max_batches > 0 stops after that many batches; 0 means the whole dataset. Throws
  // InvalidArgument when no shard holds even one batch.
  EvalLoader(std::shared_ptr<const TokenDataset> dataset, LoaderOptions options,
             int64_t max_batches = 0);

  // Fills `out` and returns true, or returns false at the end of the pass.
  bool next(Batch& out);
  void reset();
  int64_t num_batches() const { return num_batches_; }

 private:
  std::shared_ptr<const TokenDataset> dataset_;
  LoaderOptions options_;
  int64_t max_batches_;
  int64_t num_batches_ = 0;
  size_t part_ = 0;
  int64_t slot_ = 0;
  int64_t produced_ = 0;
};

}  // namespace longhaul::data
