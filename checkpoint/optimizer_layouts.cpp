// The optimizer layouts (see checkpoint/optimizer_layouts.h).
#include "checkpoint/optimizer_layouts.h"

#include <tandem/base/errors.h>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

namespace tandem::detail {

double opt_double(const StateDict& d, const std::string& key) {
  const CheckpointValue* v = d.find_value(key);
  if (v == nullptr || !std::holds_alternative<double>(*v)) {
    throw CheckpointError("tandem: checkpoint: optimizer value \"" + key + "\" is missing or not a float.");
  }
  return std::get<double>(*v);
}

int64_t opt_int(const StateDict& d, const std::string& key) {
  const CheckpointValue* v = d.find_value(key);
  if (v == nullptr || !std::holds_alternative<int64_t>(*v)) {
    throw CheckpointError("tandem: checkpoint: optimizer value \"" + key + "\" is missing or not an integer.");
  }
  return std::get<int64_t>(*v);
}

bool opt_bool(const StateDict& d, const std::string& key) {
  const CheckpointValue* v = d.find_value(key);
  if (v == nullptr || !std::holds_alternative<bool>(*v)) {
    throw CheckpointError("tandem: checkpoint: optimizer value \"" + key + "\" is missing or not a bool.");
  }
  return std::get<bool>(*v);
}

namespace {

at::Tensor opt_tensor(const StateDict& d, const std::string& key) {
  const at::Tensor* t = d.find_tensor(key);
  return t == nullptr ? at::Tensor() : *t;
}

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
    s->step(opt_int(d, p + "step"));
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
    o.lr(opt_double(d, g + "lr"));
    o.betas(std::make_tuple(opt_double(d, g + "beta1"), opt_double(d, g + "beta2")));
    o.eps(opt_double(d, g + "eps"));
    o.weight_decay(opt_double(d, g + "weight_decay"));
    o.amsgrad(opt_bool(d, g + "amsgrad"));
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
    o.lr(opt_double(d, g + "lr"));
    o.momentum(opt_double(d, g + "momentum"));
    o.dampening(opt_double(d, g + "dampening"));
    o.weight_decay(opt_double(d, g + "weight_decay"));
    o.nesterov(opt_bool(d, g + "nesterov"));
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
    s->step(opt_int(d, p + "step"));
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
    o.lr(opt_double(d, g + "lr"));
    o.lr_decay(opt_double(d, g + "lr_decay"));
    o.weight_decay(opt_double(d, g + "weight_decay"));
    o.initial_accumulator_value(opt_double(d, g + "initial_accumulator_value"));
    o.eps(opt_double(d, g + "eps"));
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
    s->step(opt_int(d, p + "step"));
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
    o.lr(opt_double(d, g + "lr"));
    o.alpha(opt_double(d, g + "alpha"));
    o.eps(opt_double(d, g + "eps"));
    o.weight_decay(opt_double(d, g + "weight_decay"));
    o.momentum(opt_double(d, g + "momentum"));
    o.centered(opt_bool(d, g + "centered"));
  };
  return c;
}

}  // namespace

std::optional<OptimizerLayout> optimizer_layout(torch::optim::Optimizer& optimizer) {
  using namespace torch::optim;
  // Most derived first: AdamW is not an Adam in libtorch, but be explicit anyway.
  if (dynamic_cast<AdamW*>(&optimizer)) return adam_like_layout<AdamWOptions, AdamWParamState>("optimizer:adamw");
  if (dynamic_cast<Adam*>(&optimizer)) return adam_like_layout<AdamOptions, AdamParamState>("optimizer:adam");
  if (dynamic_cast<SGD*>(&optimizer)) return sgd_layout();
  if (dynamic_cast<Adagrad*>(&optimizer)) return adagrad_layout();
  if (dynamic_cast<RMSprop*>(&optimizer)) return rmsprop_layout();
  return std::nullopt;
}

}  // namespace tandem::detail
