// DataLoader / EvalLoader: deterministic, resumable batch order over token shards.
#include "longhaul/data/data_loader.h"

#include <numeric>

#include <nlohmann/json.hpp>

#include "longhaul/base/error.h"

namespace longhaul::data {
namespace {

// splitmix64: a tiny generator whose output is fully specified, so the order is identical on
// every platform and standard library (std::shuffle and the std distributions are not).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) (Lemire's multiply-shift; the tiny bias is irrelevant here).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
};

uint64_t mix(uint64_t a, uint64_t b) {
  SplitMix64 g{a ^ (b * 0xd1b54a32d192ed03ull)};
  g.next();
  return g.next();
}

std::vector<int64_t> permutation(int64_t n, bool shuffle, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  if (!shuffle) return p;
  SplitMix64 g{seed};
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(g.below(static_cast<uint64_t>(i + 1)));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

void check_options(const LoaderOptions& o) {
  if (o.batch_size <= 0 || o.seq_len <= 0) {
    throw InvalidArgument("data loader: batch_size and seq_len must be positive, got " +
                          std::to_string(o.batch_size) + " and " + std::to_string(o.seq_len));
  }
  if (o.world_size <= 0 || o.rank < 0 || o.rank >= o.world_size) {
    throw InvalidArgument("data loader: rank " + std::to_string(o.rank) +
                          " is outside world_size " + std::to_string(o.world_size));
  }
}

int64_t slots_in(size_t tokens, const LoaderOptions& o) {
  if (tokens < 1) return 0;
  const auto per_round = static_cast<uint64_t>(o.batch_size * o.seq_len * o.world_size);
  return static_cast<int64_t>((tokens - 1) / per_round);
}

Batch slice(const TokenDataset& ds, size_t part, int64_t slot, const LoaderOptions& o) {
  const int64_t bt = o.batch_size * o.seq_len;
  const int64_t start = (slot * o.world_size + o.rank) * bt;
  Batch b;
  b.tokens = ds.part_tokens(part).subspan(static_cast<size_t>(start), static_cast<size_t>(bt + 1));
  b.source = ds.part_name(part);
  return b;
}

[[noreturn]] void throw_too_small(const TokenDataset& ds, const LoaderOptions& o) {
  throw InvalidArgument("data '" + ds.description() +
                        "' has no shard with enough tokens for one batch: the largest "
                        "of its " +
                        std::to_string(ds.num_parts()) +
                        " shard(s) must hold batch_size*seq_len*"
                        "world_size+1 = " +
                        std::to_string(o.batch_size * o.seq_len * o.world_size + 1) +
                        " tokens (total " + std::to_string(ds.total_tokens()) +
                        "); use smaller batch_size/seq_len or more data");
}

}  // namespace

std::shared_ptr<const TokenDataset> TokenDataset::from_glob(
    std::string_view pattern, const std::function<bool()>& stop_requested) {
  auto ds = std::make_shared<TokenDataset>();
  ds->description_ = std::string(pattern);
  const auto paths = expand_glob(pattern);
  for (const auto& path : paths) {
    if (stop_requested && stop_requested()) {
      throw Cancelled("opening " + std::string(pattern) + " abandoned after " +
                      std::to_string(ds->shards_.size()) + " of " + std::to_string(paths.size()) +
                      " shards: a stop was requested");
    }
    auto shard = std::make_unique<TokenShard>(path);
    ds->parts_.push_back(Part{path.string(), shard->tokens()});
    ds->shards_.push_back(std::move(shard));
  }
  return ds;
}

std::shared_ptr<const TokenDataset> TokenDataset::from_tokens(std::string name,
                                                              std::vector<uint16_t> tokens) {
  auto ds = std::make_shared<TokenDataset>();
  ds->description_ = name;
  ds->owned_.push_back(std::move(tokens));
  ds->parts_.push_back(Part{std::move(name), ds->owned_.back()});
  return ds;
}

uint64_t TokenDataset::total_tokens() const {
  uint64_t n = 0;
  for (const auto& p : parts_) n += p.tokens.size();
  return n;
}

void Batch::to_int32(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const {
  const size_t n = tokens.size() - 1;
  inputs.resize(n);
  targets.resize(n);
  for (size_t i = 0; i < n; ++i) {
    inputs[i] = tokens[i];
    targets[i] = tokens[i + 1];
  }
}

DataLoader::DataLoader(std::shared_ptr<const TokenDataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  check_options(options_);
  for (size_t i = 0; i < dataset_->num_parts(); ++i) {
    slots_per_part_.push_back(slots_in(dataset_->part_tokens(i).size(), options_));
    batches_per_epoch_ += slots_per_part_.back();
  }
  if (batches_per_epoch_ == 0) throw_too_small(*dataset_, options_);
  start_epoch(0);
}

void DataLoader::start_epoch(int64_t epoch) {
  position_ = LoaderPosition{epoch, 0, 0};
  load_shard_order();
  skip_empty_shards();
}

void DataLoader::load_shard_order() {
  shard_order_ = permutation(static_cast<int64_t>(dataset_->num_parts()), options_.shuffle,
                             mix(options_.seed, static_cast<uint64_t>(position_.epoch)));
  slot_order_for_ = -1;
}

void DataLoader::skip_empty_shards() {
  while (position_.shard < static_cast<int64_t>(shard_order_.size()) &&
         position_.slot >= slots_per_part_[static_cast<size_t>(shard_order_[position_.shard])]) {
    ++position_.shard;
    position_.slot = 0;
  }
  if (position_.shard >= static_cast<int64_t>(shard_order_.size())) {
    start_epoch(position_.epoch + 1);  // terminates: some part has slots
  }
}

Batch DataLoader::next() {
  const int64_t part = shard_order_[static_cast<size_t>(position_.shard)];
  if (slot_order_for_ != position_.shard) {
    slot_order_ = permutation(slots_per_part_[static_cast<size_t>(part)], options_.shuffle,
                              mix(mix(options_.seed, static_cast<uint64_t>(position_.epoch)),
                                  static_cast<uint64_t>(part)));
    slot_order_for_ = position_.shard;
  }
  Batch b = slice(*dataset_, static_cast<size_t>(part),
                  slot_order_[static_cast<size_t>(position_.slot)], options_);
  ++position_.slot;
  skip_empty_shards();
  return b;
}

std::string DataLoader::position_json() const {
  nlohmann::json j;
  j["epoch"] = position_.epoch;
  j["shard"] = position_.shard;
  j["slot"] = position_.slot;
  j["batch_tokens"] = options_.batch_size * options_.seq_len;
  j["world_size"] = options_.world_size;
  j["seed"] = options_.seed;
  j["shuffle"] = options_.shuffle;
  j["parts"] = dataset_->num_parts();
  return j.dump();
}

void DataLoader::restore(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
    LoaderPosition p{j.at("epoch").get<int64_t>(), j.at("shard").get<int64_t>(),
                     j.at("slot").get<int64_t>()};
    auto expect = [&](const char* key, auto now) {
      auto then = j.at(key).get<decltype(now)>();
      if (then != now) {
        throw FailedPrecondition(std::string("the checkpoint's data position was taken with ") +
                                 key + " = " + nlohmann::json(then).dump() +
                                 ", but the current config gives " + nlohmann::json(now).dump() +
                                 "; resume with the original data and batch settings "
                                 "or start a new logdir");
      }
    };
    expect("batch_tokens", options_.batch_size * options_.seq_len);
    expect("world_size", options_.world_size);
    expect("seed", options_.seed);
    expect("shuffle", options_.shuffle);
    expect("parts", dataset_->num_parts());
    if (p.epoch < 0 || p.shard < 0 || p.slot < 0 ||
        p.shard >= static_cast<int64_t>(dataset_->num_parts())) {
      throw InvalidArgument("data position " + std::string(text) + " is out of range");
    }
    position_ = p;
    load_shard_order();
    skip_empty_shards();
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument("data position '" + std::string(text) +
                          "' is not a loader position: " + e.what());
  }
}

EvalLoader::EvalLoader(std::shared_ptr<const TokenDataset> dataset, LoaderOptions options,
                       int64_t max_batches)
    : dataset_(std::move(dataset)), options_(options), max_batches_(max_batches) {
  check_options(options_);
  for (size_t i = 0; i < dataset_->num_parts(); ++i) {
    num_batches_ += slots_in(dataset_->part_tokens(i).size(), options_);
  }
  if (num_batches_ == 0) throw_too_small(*dataset_, options_);
  if (max_batches_ > 0) num_batches_ = std::min(num_batches_, max_batches_);
}

bool EvalLoader::next(Batch& out) {
  if (produced_ >= num_batches_) return false;
  while (slot_ >= slots_in(dataset_->part_tokens(part_).size(), options_)) {
    ++part_;
    slot_ = 0;
  }
  out = slice(*dataset_, part_, slot_, options_);
  ++slot_;
  ++produced_;
  return true;
}

void EvalLoader::reset() {
  part_ = 0;
  slot_ = 0;
  produced_ = 0;
}

}  // namespace longhaul::data
