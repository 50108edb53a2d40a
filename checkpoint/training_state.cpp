// Built-in Checkpointable adapters: modules, optimizers, generators, callbacks.
#include "checkpoint/training_state.h"

#include <tandem/base/errors.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <set>
#include <sstream>
#include <typeinfo>

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

namespace {

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

// ---- optimizers ----------------------------------------------------------------------------

std::string param_key(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

std::string pfx(size_t g, size_t i) { return "g" + std::to_string(g) + ".p" + std::to_string(i) + "."; }
std::string gfx(size_t g) { return "g" + std::to_string(g) + "."; }

double get_double(const StateDict& d, const std::string& key) {
  const CheckpointValue* v = d.find_value(key);
  if (v == nullptr || !std::holds_alternative<double>(*v)) {
    throw CheckpointError("tandem: checkpoint: optimizer value \"" + key + "\" is missing or not a float.");
  }
  return std::get<double>(*v);
}

int64_t get_int(const StateDict& d, const std::string& key) {
  const CheckpointValue* v = d.find_value(key);
  if (v == nullptr || !std::holds_alternative<int64_t>(*v)) {
    throw CheckpointError("tandem: checkpoint: optimizer value \"" + key + "\" is missing or not an integer.");
  }
  return std::get<int64_t>(*v);
}

bool get_bool(const StateDict& d, const std::string& key) {
  const CheckpointValue* v = d.find_value(key);
  if (v == nullptr || !std::holds_alternative<bool>(*v)) {
    throw CheckpointError("tandem: checkpoint: optimizer value \"" + key + "\" is missing or not a bool.");
  }
  return std::get<bool>(*v);
}

at::Tensor opt_tensor(const StateDict& d, const std::string& key) {
  const at::Tensor* t = d.find_tensor(key);
  return t == nullptr ? at::Tensor() : *t;
}

// One optimizer type: how its per-parameter state and per-group options map to names.
struct OptimizerLayout {
  std::string kind;
  std::vector<std::string> tensor_fields;  // per parameter, optional ones may be undefined
  // Per-parameter state <-> fields.
  std::function<void(const torch::optim::OptimizerParamState&, const std::string&, StateDict*)> save_state;
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const StateDict&, const std::string&)> load_state;
  std::function<void(const torch::optim::OptimizerOptions&, const std::string&, StateDict*)> save_options;
  std::function<void(torch::optim::OptimizerOptions&, const StateDict&, const std::string&)> load_options;
};

void put(StateDict* d, const std::string& key, const at::Tensor& t) {
  if (t.defined()) d->tensors.emplace_back(key, t);
}

template <typename Options, typename State>
OptimizerLayout adam_like_layout(const std::string& kind) {
  OptimizerLayout c;
  c.kind = kind;
  c.tensor_fields = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  c.save_state = [](const torch::optim::OptimizerParamState& base, const std::string& p, StateDict* d) {
    const auto& s = static_cast<const State&>(base);
    d->values[p + "step"] = static_cast<int64_t>(s.step());
    put(d, p + "exp_avg", s.exp_avg());
    put(d, p + "exp_avg_sq", s.exp_avg_sq());
    put(d, p + "max_exp_avg_sq", s.max_exp_avg_sq());
  };
  c.load_state = [](const StateDict& d, const std::string& p) {
    auto s = std::make_unique<State>();
    s->step(get_int(d, p + "step"));
    s->exp_avg(opt_tensor(d, p + "exp_avg"));
    s->exp_avg_sq(opt_tensor(d, p + "exp_avg_sq"));
    s->max_exp_avg_sq(opt_tensor(d, p + "max_exp_avg_sq"));
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(s));
  };
  c.save_options = [](const torch::optim::OptimizerOptions& base, const std::string& g, StateDict* d) {
    const auto& o = static_cast<const Options&>(base);
    d->values[g + "lr"] = o.lr();
    d->values[g + "beta1"] = std::get<0>(o.betas());
    d->values[g + "beta2"] = std::get<1>(o.betas());
    d->values[g + "eps"] = o.eps();
    d->values[g + "weight_decay"] = o.weight_decay();
    d->values[g + "amsgrad"] = o.amsgrad();
  };
  c.load_options = [](torch::optim::OptimizerOptions& base, const StateDict& d, const std::string& g) {
    auto& o = static_cast<Options&>(base);
    o.lr(get_double(d, g + "lr"));
    o.betas(std::make_tuple(get_double(d, g + "beta1"), get_double(d, g + "beta2")));
    o.eps(get_double(d, g + "eps"));
    o.weight_decay(get_double(d, g + "weight_decay"));
    o.amsgrad(get_bool(d, g + "amsgrad"));
  };
  return c;
}

OptimizerLayout sgd_layout() {
  using namespace torch::optim;
  OptimizerLayout c;
  c.kind = "optimizer:sgd";
  c.tensor_fields = {"momentum_buffer"};
  c.save_state = [](const OptimizerParamState& base, const std::string& p, StateDict* d) {
    put(d, p + "momentum_buffer", static_cast<const SGDParamState&>(base).momentum_buffer());
  };
  c.load_state = [](const StateDict& d, const std::string& p) {
    auto s = std::make_unique<SGDParamState>();
    s->momentum_buffer(opt_tensor(d, p + "momentum_buffer"));
    return std::unique_ptr<OptimizerParamState>(std::move(s));
  };
  c.save_options = [](const OptimizerOptions& base, const std::string& g, StateDict* d) {
    const auto& o = static_cast<const SGDOptions&>(base);
    d->values[g + "lr"] = o.lr();
    d->values[g + "momentum"] = o.momentum();
    d->values[g + "dampening"] = o.dampening();
    d->values[g + "weight_decay"] = o.weight_decay();
    d->values[g + "nesterov"] = o.nesterov();
  };
  c.load_options = [](OptimizerOptions& base, const StateDict& d, const std::string& g) {
    auto& o = static_cast<SGDOptions&>(base);
    o.lr(get_double(d, g + "lr"));
    o.momentum(get_double(d, g + "momentum"));
    o.dampening(get_double(d, g + "dampening"));
    o.weight_decay(get_double(d, g + "weight_decay"));
    o.nesterov(get_bool(d, g + "nesterov"));
  };
  return c;
}

OptimizerLayout adagrad_layout() {
  using namespace torch::optim;
  OptimizerLayout c;
  c.kind = "optimizer:adagrad";
  c.tensor_fields = {"sum"};
  c.save_state = [](const OptimizerParamState& base, const std::string& p, StateDict* d) {
    const auto& s = static_cast<const AdagradParamState&>(base);
    d->values[p + "step"] = static_cast<int64_t>(s.step());
    put(d, p + "sum", s.sum());
  };
  c.load_state = [](const StateDict& d, const std::string& p) {
    auto s = std::make_unique<AdagradParamState>();
    s->step(get_int(d, p + "step"));
    s->sum(opt_tensor(d, p + "sum"));
    return std::unique_ptr<OptimizerParamState>(std::move(s));
  };
  c.save_options = [](const OptimizerOptions& base, const std::string& g, StateDict* d) {
    const auto& o = static_cast<const AdagradOptions&>(base);
    d->values[g + "lr"] = o.lr();
    d->values[g + "lr_decay"] = o.lr_decay();
    d->values[g + "weight_decay"] = o.weight_decay();
    d->values[g + "initial_accumulator_value"] = o.initial_accumulator_value();
    d->values[g + "eps"] = o.eps();
  };
  c.load_options = [](OptimizerOptions& base, const StateDict& d, const std::string& g) {
    auto& o = static_cast<AdagradOptions&>(base);
    o.lr(get_double(d, g + "lr"));
    o.lr_decay(get_double(d, g + "lr_decay"));
    o.weight_decay(get_double(d, g + "weight_decay"));
    o.initial_accumulator_value(get_double(d, g + "initial_accumulator_value"));
    o.eps(get_double(d, g + "eps"));
  };
  return c;
}

OptimizerLayout rmsprop_layout() {
  using namespace torch::optim;
  OptimizerLayout c;
  c.kind = "optimizer:rmsprop";
  c.tensor_fields = {"square_avg", "momentum_buffer", "grad_avg"};
  c.save_state = [](const OptimizerParamState& base, const std::string& p, StateDict* d) {
    const auto& s = static_cast<const RMSpropParamState&>(base);
    d->values[p + "step"] = static_cast<int64_t>(s.step());
    put(d, p + "square_avg", s.square_avg());
    put(d, p + "momentum_buffer", s.momentum_buffer());
    put(d, p + "grad_avg", s.grad_avg());
  };
  c.load_state = [](const StateDict& d, const std::string& p) {
    auto s = std::make_unique<RMSpropParamState>();
    s->step(get_int(d, p + "step"));
    s->square_avg(opt_tensor(d, p + "square_avg"));
    s->momentum_buffer(opt_tensor(d, p + "momentum_buffer"));
    s->grad_avg(opt_tensor(d, p + "grad_avg"));
    return std::unique_ptr<OptimizerParamState>(std::move(s));
  };
  c.save_options = [](const OptimizerOptions& base, const std::string& g, StateDict* d) {
    const auto& o = static_cast<const RMSpropOptions&>(base);
    d->values[g + "lr"] = o.lr();
    d->values[g + "alpha"] = o.alpha();
    d->values[g + "eps"] = o.eps();
    d->values[g + "weight_decay"] = o.weight_decay();
    d->values[g + "momentum"] = o.momentum();
    d->values[g + "centered"] = o.centered();
  };
  c.load_options = [](OptimizerOptions& base, const StateDict& d, const std::string& g) {
    auto& o = static_cast<RMSpropOptions&>(base);
    o.lr(get_double(d, g + "lr"));
    o.alpha(get_double(d, g + "alpha"));
    o.eps(get_double(d, g + "eps"));
    o.weight_decay(get_double(d, g + "weight_decay"));
    o.momentum(get_double(d, g + "momentum"));
    o.centered(get_bool(d, g + "centered"));
  };
  return c;
}

class OptimizerState final : public Checkpointable {
 public:
  OptimizerState(torch::optim::Optimizer& opt, OptimizerLayout codec)
      : opt_(opt), codec_(std::move(codec)) {}
  std::string kind() const override { return codec_.kind; }

  StateDict state_dict() override {
    StateDict d;
    auto& groups = opt_.param_groups();
    d.values["groups"] = static_cast<int64_t>(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& params = groups[g].params();
      d.values[gfx(g) + "params"] = static_cast<int64_t>(params.size());
      codec_.save_options(groups[g].options(), gfx(g), &d);
      for (size_t i = 0; i < params.size(); ++i) {
        const auto it = opt_.state().find(param_key(params[i]));
        d.values[pfx(g, i) + "has_state"] = it != opt_.state().end();
        if (it != opt_.state().end()) codec_.save_state(*it->second, pfx(g, i), &d);
      }
    }
    return d;
  }

  std::string check(const StateDict& loaded) override {
    try {
      auto& groups = opt_.param_groups();
      const int64_t ng = get_int(loaded, "groups");
      if (ng != static_cast<int64_t>(groups.size())) {
        return "the checkpoint has " + std::to_string(ng) + " parameter groups, this optimizer " +
               std::to_string(groups.size());
      }
      std::set<std::string> expected_tensors;
      for (size_t g = 0; g < groups.size(); ++g) {
        const auto& params = groups[g].params();
        const int64_t np = get_int(loaded, gfx(g) + "params");
        if (np != static_cast<int64_t>(params.size())) {
          return "group " + std::to_string(g) + " has " + std::to_string(np) +
                 " parameters in the checkpoint, " + std::to_string(params.size()) + " here";
        }
        for (size_t i = 0; i < params.size(); ++i) {
          const std::string p = pfx(g, i);
          if (!get_bool(loaded, p + "has_state")) continue;
          for (const auto& field : codec_.tensor_fields) {
            const at::Tensor* t = loaded.find_tensor(p + field);
            if (t == nullptr) continue;
            expected_tensors.insert(p + field);
            if (t->sizes() != params[i].sizes()) {
              return "state \"" + p + field + "\" is " + describe_tensor(*t) + " but parameter " +
                     std::to_string(i) + " of group " + std::to_string(g) + " is " +
                     describe_tensor(params[i]);
            }
          }
        }
        // Options must be readable.
        auto options = groups[g].options().clone();
        codec_.load_options(*options, loaded, gfx(g));
      }
      for (const auto& kv : loaded.tensors) {
        if (expected_tensors.count(kv.first) == 0) return "unexpected optimizer tensor \"" + kv.first + "\"";
      }
    } catch (const CheckpointError& e) {
      return e.what();
    }
    return "";
  }

  void load(const StateDict& loaded) override {
    auto& groups = opt_.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      codec_.load_options(groups[g].options(), loaded, gfx(g));
      const auto& params = groups[g].params();
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string p = pfx(g, i);
        const std::string key = param_key(params[i]);
        if (!get_bool(loaded, p + "has_state")) {
          opt_.state().erase(key);
          continue;
        }
        auto state = codec_.load_state(loaded, p);
        opt_.state()[key] = std::move(state);
      }
    }
  }

 private:
  torch::optim::Optimizer& opt_;
  OptimizerLayout codec_;
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

std::shared_ptr<Checkpointable> optimizer_state(torch::optim::Optimizer& optimizer,
                                                const std::string& name) {
  using namespace torch::optim;
  // Most derived first: AdamW is not an Adam in libtorch, but be explicit anyway.
  if (dynamic_cast<AdamW*>(&optimizer))
    return std::make_shared<OptimizerState>(
        optimizer, adam_like_layout<AdamWOptions, AdamWParamState>("optimizer:adamw"));
  if (dynamic_cast<Adam*>(&optimizer))
    return std::make_shared<OptimizerState>(
        optimizer, adam_like_layout<AdamOptions, AdamParamState>("optimizer:adam"));
  if (dynamic_cast<SGD*>(&optimizer))
    return std::make_shared<OptimizerState>(optimizer, sgd_layout());
  if (dynamic_cast<Adagrad*>(&optimizer))
    return std::make_shared<OptimizerState>(optimizer, adagrad_layout());
  if (dynamic_cast<RMSprop*>(&optimizer))
    return std::make_shared<OptimizerState>(optimizer, rmsprop_layout());
  throw CheckpointError("tandem: checkpoint: optimizer \"" + name + "\" is a " +
                        c10::demangle(typeid(optimizer).name()) +
                        ", whose state tandem cannot save; supported: torch::optim::SGD, Adam, "
                        "AdamW, Adagrad, RMSprop. Register other optimizers with add() and a "
                        "Checkpointable of your own.");
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
