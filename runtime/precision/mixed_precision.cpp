// Checks of MixedPrecisionOptions (include/tandem/runtime/mixed_precision.h).
#include <tandem/runtime/mixed_precision.h>

#include <tandem/base/errors.h>

namespace tandem {

void check_mixed_precision(const MixedPrecisionOptions& options, const std::string& who) {
  const at::ScalarType t = options.param_dtype;
  if (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) return;
  throw ConfigError("tandem: " + who + ": mixed_precision.param_dtype " + c10::toString(t) +
                    " is not supported; use float32 (off), bfloat16 or float16 "
                    "(--set precision.param_dtype=fp32|bf16|fp16).");
}

}  // namespace tandem
