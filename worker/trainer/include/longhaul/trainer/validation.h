// The validation loss: the mean loss of a model over one pass of an EvalLoader. The one loop
// behind every evaluation (the trainer's periodic eval, `longhaul-worker eval`, the evaluator
// replica), so that all three turn a batch the model refuses into the same data error.
//
// Thread-safety: uses `model` and `val` from the calling thread only.
#pragma once

#include <cstdint>
#include <functional>

#include "longhaul/data/data_loader.h"
#include "longhaul/model/language_model.h"

namespace longhaul::trainer {

struct ValidationLoss {
  int64_t batches = 0;   // batches evaluated
  double mean_loss = 0;  // the mean of their losses; 0 when there were none
  bool stopped = false;  // should_stop ended the pass before its end
};

// Resets `val`, then takes forward_loss of each of its (batch_size, seq_len) batches; gradients
// are untouched. `should_stop`, when set, is asked before each batch: true abandons the pass
// (`stopped`, with the batches done so far). A batch the model refuses (InvalidArgument: a token
// id outside the vocabulary) throws DataError (exit 3) naming the shard it came from; any other
// error propagates as it is.
ValidationLoss validation_loss(model::LanguageModel& model, data::EvalLoader& val, int batch_size,
                               int seq_len, const std::function<bool()>& should_stop = {});

}  // namespace longhaul::trainer
