// DistributedDataParallel's fp32 master weights (runtime/ddp/master_weights.h).
#include "runtime/ddp/master_weights.h"

#include <tandem/checkpoint/checkpointable.h>

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>

#include <unordered_map>

namespace tandem::detail {

MasterWeights::MasterWeights(std::vector<at::Tensor> trainable, std::vector<at::Tensor> frozen,
                             at::ScalarType dtype)
    : params_(std::move(trainable)) {
  torch::autograd::AutoGradMode no_grad(false);
  for (auto& p : params_) {
    masters_.push_back(p.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true));
    versions_.push_back(masters_.back()._version());
    p.set_data(p.detach().to(dtype));
  }
  for (auto& p : frozen) {
    if (p.is_floating_point()) p.set_data(p.detach().to(dtype));
  }
}

void MasterWeights::cast_into_model(bool all) {
  torch::autograd::AutoGradMode no_grad(false);
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (!all && masters_[i]._version() == versions_[i]) continue;
    params_[i].copy_(masters_[i]);
    versions_[i] = masters_[i]._version();
  }
}

namespace {

// The model as an fp32 model would save it: masters for the trainable parameters, every other
// floating tensor cast up, so the checkpoint loads into a model with or without mixed precision.
class MasterModuleState final : public Checkpointable {
 public:
  MasterModuleState(torch::nn::Module& module, const std::vector<at::Tensor>& params,
                    const std::vector<at::Tensor>& masters)
      : module_(module) {
    for (size_t i = 0; i < params.size(); ++i) master_of_[params[i].unsafeGetTensorImpl()] = masters[i];
  }
  std::string kind() const override { return "module"; }

  StateDict state_dict() override {
    StateDict d;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) d.tensors.emplace_back(p.key(), saved(p.value()));
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) d.tensors.emplace_back(b.key(), b.value());
    return d;
  }

  std::string check(const StateDict& loaded) override { return check_same_tensors(state_dict().tensors, loaded); }

  void load(const StateDict& loaded) override {
    torch::autograd::AutoGradMode no_grad(false);
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      const at::Tensor& value = *loaded.find_tensor(p.key());
      auto it = master_of_.find(p.value().unsafeGetTensorImpl());
      // A master's new version makes the next forward cast it into the model.
      (it != master_of_.end() ? it->second : p.value()).copy_(value);
    }
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) b.value().copy_(*loaded.find_tensor(b.key()));
  }

 private:
  at::Tensor saved(const at::Tensor& param) const {
    auto it = master_of_.find(param.unsafeGetTensorImpl());
    if (it != master_of_.end()) return it->second;
    return param.is_floating_point() ? param.to(at::kFloat) : param;
  }

  torch::nn::Module& module_;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> master_of_;
};

}  // namespace

std::shared_ptr<Checkpointable> MasterWeights::module_state(torch::nn::Module& module) {
  return std::make_shared<MasterModuleState>(module, params_, masters_);
}

}  // namespace tandem::detail
