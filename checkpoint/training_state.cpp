// Built-in Checkpointable adapters: modules, generators, callbacks (optimizers are in
// optimizer_state.cpp); torch <-> checkpoint dtypes; StateDict.
#include "checkpoint/training_state.h"

#include <tandem/base/errors.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <set>
#include <sstream>

namespace tandem {

DType to_checkpoint_dtype(at::ScalarType type) {
  switch (type) {
    case at::kDouble: return DType::kF64;
    case at::kFloat: return DType::kF32;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    case at::kLong: return DType::kI64;
    case at::kInt: return DType::kI32;
    case at::kShort: return DType::kI16;
    case at::kChar: return DType::kI8;
    case at::kByte: return DType::kU8;
    case at::kBool: return DType::kBool;
    default:
      throw CheckpointError(std::string("tandem: checkpoint: tensors of dtype ") + c10::toString(type) +
                            " cannot be saved; supported: float64, float32, float16, bfloat16, "
                            "int64, int32, int16, int8, uint8, bool (convert complex or quantized "
                            "tensors in a Checkpointable).");
  }
}

at::ScalarType to_scalar_type(DType dtype) {
  switch (dtype) {
    case DType::kF64: return at::kDouble;
    case DType::kF32: return at::kFloat;
    case DType::kF16: return at::kHalf;
    case DType::kBF16: return at::kBFloat16;
    case DType::kI64: return at::kLong;
    case DType::kI32: return at::kInt;
    case DType::kI16: return at::kShort;
    case DType::kI8: return at::kChar;
    case DType::kU8: return at::kByte;
    case DType::kBool: return at::kBool;
  }
  return at::kByte;
}

const at::Tensor* StateDict::find_tensor(const std::string& key) const {
  for (const auto& kv : tensors) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

const CheckpointValue* StateDict::find_value(const std::string& key) const {
  const auto it = values.find(key);
  return it == values.end() ? nullptr : &it->second;
}

namespace detail {

std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream os;
  os << c10::toString(t.scalar_type()) << " " << t.sizes();
  return os.str();
}

// Checks that `loaded` has exactly the tensors `want` (same names, dtypes, shapes).
std::string check_same_tensors(const std::vector<std::pair<std::string, at::Tensor>>& want,
                               const StateDict& loaded) {
  std::set<std::string> expected;
  for (const auto& [key, t] : want) {
    expected.insert(key);
    const at::Tensor* got = loaded.find_tensor(key);
    if (got == nullptr) return "tensor \"" + key + "\" is missing from the checkpoint";
    if (got->scalar_type() != t.scalar_type() || got->sizes() != t.sizes()) {
      return "tensor \"" + key + "\" is " + describe_tensor(*got) + " in the checkpoint but " +
             describe_tensor(t) + " here";
    }
  }
  for (const auto& kv : loaded.tensors) {
    if (expected.count(kv.first) == 0) {
      return "the checkpoint has tensor \"" + kv.first + "\" which this object does not";
    }
  }
  return "";
}

namespace {

// ---- modules -------------------------------------------------------------------------------

class ModuleState final : public Checkpointable {
 public:
  explicit ModuleState(torch::nn::Module& m) : module_(m) {}
  std::string kind() const override { return "module"; }

  StateDict state_dict() override {
    StateDict d;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) d.tensors.emplace_back(p.key(), p.value());
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) d.tensors.emplace_back(b.key(), b.value());
    return d;
  }

  std::string check(const StateDict& loaded) override { return check_same_tensors(state_dict().tensors, loaded); }

  void load(const StateDict& loaded) override {
    at::NoGradGuard no_grad;
    for (auto& [key, t] : state_dict().tensors) t.copy_(*loaded.find_tensor(key));
  }

 private:
  torch::nn::Module& module_;
};

// ---- generators ----------------------------------------------------------------------------

class GeneratorState final : public Checkpointable {
 public:
  explicit GeneratorState(at::Generator g) : gen_(std::move(g)) {}
  std::string kind() const override { return "rng"; }
  StateDict state_dict() override {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    StateDict d;
    d.tensors.emplace_back("state", gen_.get_state());
    return d;
  }
  std::string check(const StateDict& loaded) override { return check_same_tensors(state_dict().tensors, loaded); }
  void load(const StateDict& loaded) override {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(*loaded.find_tensor("state"));
  }

 private:
  at::Generator gen_;
};

// ---- callbacks ------------------------------------------------------------------

class TensorsState final : public Checkpointable {
 public:
  TensorsState(std::function<std::map<std::string, at::Tensor>()> get,
               std::function<void(const std::map<std::string, at::Tensor>&)> set)
      : get_(std::move(get)), set_(std::move(set)) {}
  std::string kind() const override { return "tensors"; }
  StateDict state_dict() override {
    StateDict d;
    for (const auto& [k, t] : get_()) d.tensors.emplace_back(k, t);
    return d;
  }
  std::string check(const StateDict& loaded) override { return ""; }
  void load(const StateDict& loaded) override {
    set_(std::map<std::string, at::Tensor>(loaded.tensors.begin(), loaded.tensors.end()));
  }

 private:
  std::function<std::map<std::string, at::Tensor>()> get_;
  std::function<void(const std::map<std::string, at::Tensor>&)> set_;
};

class ValuesState final : public Checkpointable {
 public:
  ValuesState(std::function<std::map<std::string, CheckpointValue>()> get,
              std::function<void(const std::map<std::string, CheckpointValue>&)> set)
      : get_(std::move(get)), set_(std::move(set)) {}
  std::string kind() const override { return "values"; }
  StateDict state_dict() override {
    StateDict d;
    d.values = get_();
    return d;
  }
  std::string check(const StateDict& loaded) override {
    return loaded.tensors.empty() ? "" : "a values state holds no tensors";
  }
  void load(const StateDict& loaded) override { set_(loaded.values); }

 private:
  std::function<std::map<std::string, CheckpointValue>()> get_;
  std::function<void(const std::map<std::string, CheckpointValue>&)> set_;
};

}  // namespace

std::shared_ptr<Checkpointable> module_state(torch::nn::Module& module) {
  return std::make_shared<ModuleState>(module);
}

std::shared_ptr<Checkpointable> generator_state(at::Generator generator) {
  if (!generator.defined()) generator = at::detail::getDefaultCPUGenerator();
  return std::make_shared<GeneratorState>(std::move(generator));
}

std::shared_ptr<Checkpointable> tensors_state(
    std::function<std::map<std::string, at::Tensor>()> get,
    std::function<void(const std::map<std::string, at::Tensor>&)> set) {
  return std::make_shared<TensorsState>(std::move(get), std::move(set));
}

std::shared_ptr<Checkpointable> values_state(
    std::function<std::map<std::string, CheckpointValue>()> get,
    std::function<void(const std::map<std::string, CheckpointValue>&)> set) {
  return std::make_shared<ValuesState>(std::move(get), std::move(set));
}

}  // namespace detail
}  // namespace tandem
