// Built-in Checkpointable adapters (internal to libtandem): modules, generators, tensor and value
// callbacks (training_state.cpp). The optimizers' adapter (optimizer_state.cpp) and the checks
// runtime/ uses too are declared in <tandem/checkpoint/checkpointable.h> (namespace detail).
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

namespace tandem::detail {

std::shared_ptr<Checkpointable> module_state(torch::nn::Module& module);
std::shared_ptr<Checkpointable> generator_state(at::Generator generator);
std::shared_ptr<Checkpointable> tensors_state(
    std::function<std::map<std::string, at::Tensor>()> get,
    std::function<void(const std::map<std::string, at::Tensor>&)> set);
std::shared_ptr<Checkpointable> values_state(
    std::function<std::map<std::string, CheckpointValue>()> get,
    std::function<void(const std::map<std::string, CheckpointValue>&)> set);

}  // namespace tandem::detail
