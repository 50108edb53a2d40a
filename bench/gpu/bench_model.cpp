#include "bench/gpu/bench_model.h"

#include <torch/cuda.h>

#include <stdexcept>

namespace tandem::bench_gpu {

const std::vector<std::string>& training_modes() {
  static const std::vector<std::string> modes = {"plain", "ddp", "zero1", "zero2", "zero3",
                                                 "bf16_masters", "fp16_scaler"};
  return modes;
}

namespace {

c10::Device& device_setting() {
  static c10::Device device(c10::kCUDA, 0);
  return device;
}

}  // namespace

c10::Device bench_device() { return device_setting(); }

void set_bench_device(c10::Device device) { device_setting() = device; }

void synchronize() {
  if (bench_device().is_cuda()) torch::cuda::synchronize();
}

MlpImpl::MlpImpl() {
  for (int i = 0; i < kLayers; ++i) {
    layers.push_back(register_module(std::to_string(i), ShardedUnit<torch::nn::LinearImpl>(
                                                            torch::nn::Linear(kWidth, kWidth))));
  }
}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  for (size_t i = 0; i < layers.size(); ++i) {
    x = layers[i](x);
    if (i + 1 < layers.size()) x = torch::relu(x);
  }
  return x;
}

ModeRunner::ModeRunner(const std::string& mode, std::shared_ptr<Communicator> world,
                       int64_t batch)
    : mode_(mode) {
  torch::manual_seed(0);
  model_ = std::make_shared<MlpImpl>();
  model_->to(bench_device());
  for (const auto& p : model_->parameters()) parameters_ += p.numel();  // before any wrapper
  x_ = torch::randn({batch, kWidth}, bench_device());
  y_ = torch::randn({batch, kWidth}, bench_device());
  DistributedDataParallelOptions options;
  std::vector<at::Tensor> params;
  if (mode == "plain") {
    params = model_->parameters();
  } else if (mode == "ddp" || mode == "bf16_masters" || mode == "fp16_scaler") {
    if (mode == "bf16_masters") options.mixed_precision.param_dtype = at::kBFloat16;
    if (mode == "fp16_scaler") options.mixed_precision.param_dtype = at::kHalf;
    ddp_ = std::make_unique<DistributedDataParallel<MlpImpl>>(model_, world, options);
    params = ddp_->parameters();
  } else if (mode == "zero1" || mode == "zero2" || mode == "zero3") {
    ShardingOptions sharding;
    sharding.stage = mode.back() - '0';
    sdp_ = std::make_unique<ShardedDataParallel<MlpImpl>>(model_, world, sharding, options);
    params = sdp_->parameters();
  } else {
    throw std::invalid_argument("bench_gpu: unknown mode '" + mode + "'");
  }
  opt_ = std::make_unique<torch::optim::AdamW>(
      params, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  if (mode == "fp16_scaler") scaler_ = std::make_unique<GradScaler>(GradScalerOptions{}, world);
}

ModeRunner::~ModeRunner() = default;

at::Tensor ModeRunner::forward(const at::Tensor& x) {
  if (ddp_) return (*ddp_)(x);
  if (sdp_) return (*sdp_)(x);
  return model_->forward(x);
}

void ModeRunner::step() {
  opt_->zero_grad();
  loss_ = torch::mse_loss(forward(x_).to(at::kFloat), y_);
  if (scaler_) {
    scaler_->scale(loss_).backward();
    scaler_->step(*opt_);
    scaler_->update();
  } else {
    loss_.backward();
    opt_->step();
  }
}

void ModeRunner::register_checkpoint(CheckpointManager& ckpt) {
  if (!ddp_) throw std::invalid_argument("bench_gpu: checkpoints are measured under ddp");
  ddp_->register_checkpoint(ckpt, "model");
  ckpt.add_optimizer("optim", *opt_);
}

}  // namespace tandem::bench_gpu
