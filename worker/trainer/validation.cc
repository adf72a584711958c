// The validation-loss loop. See validation.h.
#include "longhaul/trainer/validation.h"

#include <string>
#include <vector>

#include "longhaul/base/error.h"
#include "longhaul/trainer/trainer.h"

namespace longhaul::trainer {

ValidationLoss validation_loss(model::LanguageModel& model, data::EvalLoader& val, int batch_size,
                               int seq_len, const std::function<bool()>& should_stop) {
  ValidationLoss result;
  std::vector<int32_t> inputs, targets;
  data::Batch batch;
  double sum = 0;
  val.reset();
  while (val.next(batch)) {
    if (should_stop && should_stop()) {
      result.stopped = true;
      break;
    }
    batch.to_int32(inputs, targets);
    try {
      sum += model.forward_loss(inputs.data(), targets.data(), batch_size, seq_len);
    } catch (const InvalidArgument& e) {
      throw DataError(Code::kInvalidArgument,
                      "bad validation batch from " + std::string(batch.source) + ": " + e.what());
    }
    ++result.batches;
  }
  if (result.batches > 0) result.mean_loss = sum / static_cast<double>(result.batches);
  return result;
}

}  // namespace longhaul::trainer
