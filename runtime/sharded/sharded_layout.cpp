// ShardedDataParallel, construction: which parameters form which unit, the flat layout, the
// check that every rank built the same, and ShardedUnit's adoption of the wrapped module.
#include "runtime/sharded/sharded_state.h"

#include <tandem/base/errors.h>
#include <tandem/runtime/bucket_plan.h>
#include <tandem/runtime/reducer.h>

#include "runtime/rank_agreement.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <map>
#include <sstream>

namespace tandem {

using State = ShardedDataParallelCore::State;

detail::ShardedUnitBase::ShardedUnitBase(std::shared_ptr<torch::nn::Module> inner)
    : inner_(std::move(inner)) {
  if (!inner_) throw ConfigError("tandem: ShardedUnit: the wrapped module is null.");
  // The wrapped module's own names, so state dicts match the plain model.
  for (auto& p : inner_->named_parameters(/*recurse=*/false)) register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (auto& c : inner_->named_children()) register_module(c.key(), c.value());
}

void State::build_units() {
  for (auto& item : module->named_parameters()) {
    if (item.value().requires_grad()) {
      params.push_back(item.value());
      names.push_back(item.key());
    } else {
      frozen.push_back(item.value());
    }
  }
  for (auto& b : module->named_buffers()) {
    buffers.push_back(b.value());
    buffer_names.push_back(b.key());
  }
  if (params.empty()) {
    throw ConfigError("tandem: ShardedDataParallel: the module has no parameter that requires "
                      "grad; there is nothing to shard.");
  }
  std::map<const c10::TensorImpl*, int64_t> index;
  for (size_t p = 0; p < params.size(); ++p) index[params[p].unsafeGetTensorImpl()] = static_cast<int64_t>(p);
  unit_of.assign(params.size(), -1);

  const auto add_unit = [&](std::string name, std::vector<int64_t> members) {
    detail::FlatUnit u;
    u.name = std::move(name);
    u.params = std::move(members);
    units.push_back(std::move(u));
    for (int64_t p : units.back().params) unit_of[p] = static_cast<int>(units.size() - 1);
  };

  if (shards.parameters) {
    std::map<int64_t, std::string> owner;  // param -> unit name
    for (auto& item : module->named_modules()) {
      auto* unit = dynamic_cast<detail::ShardedUnitBase*>(item.value().get());
      if (unit == nullptr) continue;
      const std::string name = item.key().empty() ? "(model)" : item.key();
      std::vector<int64_t> members;
      for (auto& p : unit->named_parameters()) {
        auto it = index.find(p.value().unsafeGetTensorImpl());
        if (it == index.end()) continue;  // frozen
        auto [seen, fresh] = owner.emplace(it->second, name);
        if (!fresh) {
          throw ConfigError("tandem: ShardedDataParallel: parameter '" + names[it->second] +
                            "' is in two units, '" + seen->second + "' and '" + name +
                            "' (a ShardedUnit inside another, or one module shared by two). "
                            "Each parameter must belong to one unit: wrap the inner modules only, "
                            "or leave the shared module outside ShardedUnit (root unit).");
        }
        members.push_back(it->second);
      }
      add_unit(name, std::move(members));
      unit->attach(this, static_cast<int>(units.size() - 1));
    }
    std::vector<int64_t> rest;
    for (size_t p = 0; p < params.size(); ++p) {
      if (unit_of[p] < 0) rest.push_back(static_cast<int64_t>(p));
    }
    if (!rest.empty()) {
      add_unit("(root)", std::move(rest));
      root = static_cast<int>(units.size() - 1);
    }
  } else {
    // Stages 0-2: units are gradient buckets, reduced in the order backward fills them.
    std::vector<int64_t> order(params.size());
    std::vector<at::ScalarType> dtypes;
    std::vector<int64_t> bytes;
    for (size_t p = 0; p < params.size(); ++p) {
      order[p] = static_cast<int64_t>(params.size() - 1 - p);
      dtypes.push_back(params[p].scalar_type());
      bytes.push_back(params[p].numel() * static_cast<int64_t>(params[p].element_size()));
    }
    auto plan = plan_buckets(order, dtypes, bytes, caps.first_bytes, caps.bytes);
    for (size_t b = 0; b < plan.size(); ++b) {
      std::sort(plan[b].begin(), plan[b].end());  // registration order inside a unit
      add_unit("bucket " + std::to_string(b), std::move(plan[b]));
    }
  }
  for (auto& u : units) lay_out(u);
}

void State::lay_out(detail::FlatUnit& u) {
  const int n = shard_size();
  for (size_t k = 0; k < u.params.size(); ++k) {
    const at::Tensor& p = params[u.params[k]];
    if (k == 0) {
      u.options = p.options().requires_grad(false);
    } else if (p.scalar_type() != u.options.dtype().toScalarType() || p.device() != u.options.device()) {
      throw ConfigError("tandem: ShardedDataParallel: unit '" + u.name + "' mixes parameters of " +
                        std::string(c10::toString(u.options.dtype().toScalarType())) + " and " +
                        std::string(c10::toString(p.scalar_type())) + " (parameter '" +
                        names[u.params[k]] + "', or another device). A unit is one flat buffer "
                        "of one dtype on one device: split it into ShardedUnits of one dtype.");
    }
  }
  if (u.params.empty()) return;
  std::vector<int64_t> numels;
  for (int64_t p : u.params) numels.push_back(params[p].numel());
  const c10::Device device = params[u.params.front()].device();
  u.offsets = flat_layout(numels, static_cast<int64_t>(u.options.dtype().itemsize()), device,
                          &u.numel);
  u.master_options = u.options;
  u.grad_options = u.options;
  if (mixed.enabled()) {
    if (u.options.dtype() != at::kFloat) {
      throw ConfigError("tandem: ShardedDataParallel: unit '" + u.name + "' holds " +
                        std::string(c10::toString(u.options.dtype().toScalarType())) +
                        " parameters; mixed precision (precision.param_dtype) keeps float32 masters "
                        "of float32 parameters. Build the model in float32, or --set "
                        "precision.param_dtype=fp32.");
    }
    u.grad_options = u.options.dtype(mixed.reduce_dtype());
  }
  // Every shard starts aligned too (the optimizer's kernels run over it): a multiple of
  // flat_alignment elements is aligned in every dtype a shard is held in.
  const int64_t align = flat_alignment(device);
  u.shard_numel = ((u.numel + n - 1) / n + align - 1) / align * align;
  torch::autograd::AutoGradMode no_grad(false);
  u.flat = at::zeros({u.padded_numel(n)}, u.options);
  for (size_t k = 0; k < u.params.size(); ++k) {
    at::Tensor& p = params[u.params[k]];
    at::Tensor view = u.flat.narrow(0, u.offsets[k], p.numel()).view(p.sizes());
    view.copy_(p);
    p.set_data(view);
  }
  const int64_t begin = static_cast<int64_t>(shard_rank()) * u.shard_numel;
  if (!shards.parameters) {
    // A leaf over this rank's slice of the flat buffer: stepping it steps the parameters.
    u.shard = at::empty({0}, u.options);
    u.shard.set_(u.flat.storage(), u.flat.storage_offset() + begin, {u.shard_numel}, {1});
  } else {
    u.shard = u.flat.narrow(0, begin, u.shard_numel).clone();
  }
  u.shard.requires_grad_(true);
  if (!shards.gradients && !mixed.enabled()) {
    // Unsharded gradients stay whole: the parameters' .grad live in grad_flat, as DDP's buckets.
    u.grad_flat = at::zeros({u.padded_numel(n)}, u.options);
    for (size_t k = 0; k < u.params.size(); ++k) {
      at::Tensor& p = params[u.params[k]];
      p.mutable_grad() = u.grad_flat.narrow(0, u.offsets[k], p.numel()).view(p.sizes()).detach();
    }
  }
}

void State::lower_precision(detail::FlatUnit& u) {
  if (u.params.empty()) return;
  torch::autograd::AutoGradMode no_grad(false);
  const int64_t begin = static_cast<int64_t>(shard_rank()) * u.shard_numel;
  u.shard = u.flat.narrow(0, begin, u.shard_numel).clone().requires_grad_(true);
  u.options = u.options.dtype(mixed.param_dtype);
  at::Tensor low = u.flat.to(mixed.param_dtype);
  for (size_t k = 0; k < u.params.size(); ++k) {
    at::Tensor& p = params[u.params[k]];
    p.set_data(low.narrow(0, u.offsets[k], p.numel()).view(p.sizes()));
  }
  u.flat = low;
  // Unsharded gradients stay whole, in the reduce dtype; the parameters' low-precision .grad are
  // copied in when the unit is reduced.
  if (!shards.gradients) u.grad_flat = at::zeros({u.padded_numel(shard_size())}, u.grad_options);
}

void State::verify_same_everywhere() {
  std::ostringstream mine;
  for (const auto& u : units) {
    mine << "unit " << u.name << ": " << u.numel << " "
         << c10::toString(u.options.dtype().toScalarType()) << " "
         << c10::DeviceTypeName(u.options.device().type()) << "\n";
    for (int64_t p : u.params) mine << "  " << names[p] << " " << params[p].sizes() << "\n";
  }
  detail::check_same_on_every_rank(*world, mine.str(), "tandem: ShardedDataParallel: the ranks built "
                                   "different models or units",
                                   "Every rank must construct the same model, with the same "
                                   "ShardedUnits, before wrapping it.");
}

}  // namespace tandem
