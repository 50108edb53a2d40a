// How each supported torch optimizer's per-parameter state and per-group options map to the
// named tensors and values of a StateDict (used by optimizer_state.cpp). Not installed.
#pragma once

#include <tandem/checkpoint/checkpointable.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
class OptimizerOptions;
class OptimizerParamState;
}  // namespace torch::optim

namespace tandem::detail {

// One optimizer type: how its per-parameter state and per-group options map to names.
struct OptimizerLayout {
  std::string kind;                        // "optimizer:adamw", ... (recorded in the manifest)
  std::vector<std::string> tensor_fields;  // per parameter, optional ones may be undefined
  // Per-parameter state <-> fields.
  std::function<void(const torch::optim::OptimizerParamState&, const std::string&, StateDict*)> save_state;
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const StateDict&, const std::string&)> load_state;
  std::function<void(const torch::optim::OptimizerOptions&, const std::string&, StateDict*)> save_options;
  std::function<void(torch::optim::OptimizerOptions&, const StateDict&, const std::string&)> load_options;
};

// The layout of SGD, Adam, AdamW, Adagrad or RMSprop; nullopt for any other optimizer type.
std::optional<OptimizerLayout> optimizer_layout(torch::optim::Optimizer& optimizer);

// A value of a loaded optimizer state; CheckpointError when missing or of another type.
double opt_double(const StateDict& d, const std::string& key);
int64_t opt_int(const StateDict& d, const std::string& key);
bool opt_bool(const StateDict& d, const std::string& key);

}  // namespace tandem::detail
