// `longhaul-worker prepare-data`: text -> token shards (bytes or GPT-2 BPE).
#include <cstdio>

#include "commands.h"
#include "exit_codes.h"
#include "longhaul/base/error.h"
#include "longhaul/data/prepare.h"

namespace longhaul::cli {

int run_prepare(const PrepareArgs& args) {
  data::PrepareOptions o;
  for (const auto& in : args.inputs) o.inputs.emplace_back(in);
  o.output_dir = args.output_dir;
  o.tokenizer = args.tokenizer;
  o.vocab = args.vocab;
  o.merges = args.merges;
  o.val_fraction = args.val_fraction;
  o.shard_tokens = static_cast<size_t>(args.shard_tokens);
  data::PrepareResult r;
  try {
    r = data::prepare_text_shards(o);
  } catch (const Error& e) {
    if (e.code() == Code::kInvalidArgument) throw;                    // bad flags: exit 2
    if (e.code() == Code::kPermissionDenied) throw;                   // output dir: exit 1
    throw InvalidArgument(std::string("prepare-data: ") + e.what());  // unreadable input
  }
  std::printf(
      "wrote %zu train shard(s) (%llu tokens) and %zu val shard(s) (%llu tokens) of %s tokens "
      "to %s\n",
      r.train_shards.size(), static_cast<unsigned long long>(r.train_tokens), r.val_shards.size(),
      static_cast<unsigned long long>(r.val_tokens), args.tokenizer.c_str(),
      args.output_dir.c_str());
  std::printf(
      "train with: --set data.train='%s/train_*.bin'%s\n", args.output_dir.c_str(),
      r.val_shards.empty() ? "" : (" --set data.val='" + args.output_dir + "/val_*.bin'").c_str());
  if (args.tokenizer != "bytes") {
    std::printf("the model needs model.vocab_size >= %d (the gpt2-124m preset has 50257)\n",
                r.vocab_size);
  }
  return kExitFinished;
}

}  // namespace longhaul::cli
