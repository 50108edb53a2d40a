// The model and the training modes of bench_gpu (bench/gpu/pytorch_gpu.py builds the same model
// in Python): 8 x Linear(4096, 4096) with ReLU between them, 134,250,496 fp32 parameters, each
// Linear a ShardedUnit (stage 3 gathers one at a time, as FSDP2 with fully_shard per Linear);
// MSE against a fixed random target; AdamW lr 1e-3, weight decay 0.01.
//
// A ModeRunner builds one mode on the GPU and runs its steps:
//   plain         the model and AdamW, no wrapper (libtorch's C++ AdamW, one parameter at a time)
//   ddp           DistributedDataParallel, default options
//   zero1..zero3  ShardedDataParallel at that stage, default options
//   bf16_masters  DistributedDataParallel, bf16 parameters with fp32 masters
//   fp16_scaler   DistributedDataParallel, fp16 parameters with fp32 masters, GradScaler
// Ownership: owns the model, the wrapper and the optimizer; shares the communicator.
// Thread-safety: one thread. Errors: std::invalid_argument for an unknown mode; the wrappers'.
#pragma once

#include <tandem/tandem.h>

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::bench_gpu {

inline constexpr int64_t kWidth = 4096;
inline constexpr int kLayers = 8;

const std::vector<std::string>& training_modes();

// Where every mode trains: cuda:0, or the CPU after set_bench_device(kCPU) (bench_gpu --device cpu,
// a rehearsal of the program where no GPU is; none of its figures means anything). Set it before
// any ModeRunner exists; one thread.
c10::Device bench_device();
void set_bench_device(c10::Device device);
// Waits for the work queued on bench_device() (torch::cuda::synchronize; nothing on the CPU).
void synchronize();

struct MlpImpl : torch::nn::Module {
  MlpImpl();
  torch::Tensor forward(torch::Tensor x);
  std::vector<ShardedUnit<torch::nn::LinearImpl>> layers;
};

class ModeRunner {
 public:
  ModeRunner(const std::string& mode, std::shared_ptr<Communicator> world, int64_t batch);
  ~ModeRunner();
  ModeRunner(const ModeRunner&) = delete;
  ModeRunner& operator=(const ModeRunner&) = delete;

  // zero_grad, forward, loss, backward, optimizer step (GradScaler's step and update under
  // fp16_scaler); returns without waiting for the GPU.
  void step();
  // The model and the optimizer, as a training program checkpoints them (ddp only).
  void register_checkpoint(CheckpointManager& ckpt);
  int64_t parameters() const { return parameters_; }
  double last_loss() const { return loss_.item<double>(); }

 private:
  at::Tensor forward(const at::Tensor& x);

  std::string mode_;
  std::shared_ptr<MlpImpl> model_;
  std::unique_ptr<DistributedDataParallel<MlpImpl>> ddp_;
  std::unique_ptr<ShardedDataParallel<MlpImpl>> sdp_;
  std::unique_ptr<torch::optim::AdamW> opt_;
  std::unique_ptr<GradScaler> scaler_;
  at::Tensor x_, y_, loss_;
  int64_t parameters_ = 0;
};

}  // namespace tandem::bench_gpu
