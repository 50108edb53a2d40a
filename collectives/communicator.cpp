#include <tandem/collectives/communicator.h>

#include <tandem/base/errors.h>

namespace tandem {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "?";
}

ReduceOp parse_reduce_op(const std::string& name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                      ReduceOp::kProduct}) {
    if (name == to_string(op)) return op;
  }
  throw ConfigError("tandem: unknown reduce op '" + name +
                    "'; expected one of sum, avg, min, max, product.");
}

}  // namespace tandem
