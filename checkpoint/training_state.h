// Built-in Checkpointable adapters (internal to libtandem): modules, generators, tensor and value
// callbacks (training_state.cpp), optimizers (optimizer_state.cpp).
#pragma once

#include <tandem/checkpoint/checkpointable.h>

#include <ATen/core/Generator.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn
namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace tandem::detail {

std::shared_ptr<Checkpointable> module_state(torch::nn::Module& module);
std::shared_ptr<Checkpointable> optimizer_state(torch::optim::Optimizer& optimizer,
                                                const std::string& name);
std::shared_ptr<Checkpointable> generator_state(at::Generator generator);
std::shared_ptr<Checkpointable> tensors_state(
    std::function<std::map<std::string, at::Tensor>()> get,
    std::function<void(const std::map<std::string, at::Tensor>&)> set);
std::shared_ptr<Checkpointable> values_state(
    std::function<std::map<std::string, CheckpointValue>()> get,
    std::function<void(const std::map<std::string, CheckpointValue>&)> set);

// Empty when `loaded` has exactly the tensors `want` (same names, dtypes, shapes); otherwise what
// differs first, for Checkpointable::check().
std::string check_same_tensors(const std::vector<std::pair<std::string, at::Tensor>>& want,
                               const StateDict& loaded);

// "expected float32 [4, 3], found float16 [4]" style description.
std::string describe_tensor(const at::Tensor& t);

}  // namespace tandem::detail
