// OptimizerState: a torch optimizer's state and options as a Checkpointable, through its
// OptimizerLayout (checkpoint/optimizer_layouts.h).
#include "checkpoint/training_state.h"

#include <tandem/base/errors.h>

#include "checkpoint/optimizer_layouts.h"

#include <c10/util/Type.h>
#include <torch/optim/optimizer.h>

#include <set>
#include <typeinfo>

namespace tandem::detail {
namespace {

// torch::optim keys its state by the parameter's TensorImpl.
void* param_key(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }

std::string pfx(size_t g, size_t i) { return "g" + std::to_string(g) + ".p" + std::to_string(i) + "."; }
std::string gfx(size_t g) { return "g" + std::to_string(g) + "."; }

// One parameter's loaded state (prefix `p`), placed where the parameter lives, as
// torch.optim.Optimizer.load_state_dict places it: every tensor on the parameter's device (the
// checkpoint loads into host memory; a CUDA model steps on the GPU), floating state in the
// parameter's dtype. A tensor already there is kept as it is (no copy).
StateDict placed(const StateDict& loaded, const std::string& p, const std::vector<std::string>& fields,
                 const at::Tensor& param) {
  StateDict out;
  for (auto it = loaded.values.lower_bound(p); it != loaded.values.end() && it->first.rfind(p, 0) == 0; ++it) {
    out.values.insert(*it);
  }
  for (const auto& field : fields) {
    const at::Tensor* t = loaded.find_tensor(p + field);
    if (t == nullptr) continue;
    const bool cast = t->is_floating_point() && param.is_floating_point();
    out.tensors.emplace_back(p + field, t->to(param.device(), cast ? param.scalar_type() : t->scalar_type()));
  }
  return out;
}

class OptimizerState final : public Checkpointable {
 public:
  OptimizerState(torch::optim::Optimizer& opt, OptimizerLayout layout)
      : opt_(opt), layout_(std::move(layout)) {}
  std::string kind() const override { return layout_.kind; }
  bool changes_only_in_optimizer_step() const override { return true; }

  StateDict state_dict() override {
    StateDict d;
    auto& groups = opt_.param_groups();
    d.values["groups"] = static_cast<int64_t>(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& params = groups[g].params();
      d.values[gfx(g) + "params"] = static_cast<int64_t>(params.size());
      layout_.save_options(groups[g].options(), gfx(g), &d);
      for (size_t i = 0; i < params.size(); ++i) {
        const auto it = opt_.state().find(param_key(params[i]));
        d.values[pfx(g, i) + "has_state"] = it != opt_.state().end();
        if (it != opt_.state().end()) layout_.save_state(*it->second, pfx(g, i), &d);
      }
    }
    return d;
  }

  std::string check(const StateDict& loaded) override {
    try {
      auto& groups = opt_.param_groups();
      const int64_t ng = opt_int(loaded, "groups");
      if (ng != static_cast<int64_t>(groups.size())) {
        return "the checkpoint has " + std::to_string(ng) + " parameter groups, this optimizer " +
               std::to_string(groups.size());
      }
      std::set<std::string> expected_tensors;
      for (size_t g = 0; g < groups.size(); ++g) {
        const auto& params = groups[g].params();
        const int64_t np = opt_int(loaded, gfx(g) + "params");
        if (np != static_cast<int64_t>(params.size())) {
          return "group " + std::to_string(g) + " has " + std::to_string(np) +
                 " parameters in the checkpoint, " + std::to_string(params.size()) + " here";
        }
        for (size_t i = 0; i < params.size(); ++i) {
          const std::string p = pfx(g, i);
          if (!opt_bool(loaded, p + "has_state")) continue;
          for (const auto& field : layout_.tensor_fields) {
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
        layout_.load_options(*options, loaded, gfx(g));
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
      layout_.load_options(groups[g].options(), loaded, gfx(g));
      const auto& params = groups[g].params();
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string p = pfx(g, i);
        void* const key = param_key(params[i]);
        if (!opt_bool(loaded, p + "has_state")) {
          opt_.state().erase(key);
          continue;
        }
        auto state = layout_.load_state(placed(loaded, p, layout_.tensor_fields, params[i]), p);
        opt_.state()[key] = std::move(state);
      }
    }
  }

 private:
  torch::optim::Optimizer& opt_;
  OptimizerLayout layout_;
};

}  // namespace

std::shared_ptr<Checkpointable> optimizer_state(torch::optim::Optimizer& optimizer,
                                                const std::string& name) {
  std::optional<OptimizerLayout> layout = optimizer_layout(optimizer);
  if (layout) return std::make_shared<OptimizerState>(optimizer, std::move(*layout));
  throw CheckpointError("tandem: checkpoint: optimizer \"" + name + "\" is a " +
                        c10::demangle(typeid(optimizer).name()) +
                        ", whose state tandem cannot save; supported: torch::optim::SGD, Adam, "
                        "AdamW, Adagrad, RMSprop. Register other optimizers with add() and a "
                        "Checkpointable of your own.");
}

}  // namespace tandem::detail
