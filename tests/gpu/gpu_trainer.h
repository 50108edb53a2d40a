// Training runs of the gpu tests: the plain loop, or the same steps under DistributedDataParallel
// or ShardedDataParallel, with a recipe's precision, clipping, dropout and activation
// checkpointing. The plain loop is the reference: at world N it computes each rank's gradients
// in turn and averages them (ranks 0..N-1 in order, as every reduction here does), in fp32 from
// fp32 masters under mixed precision, exactly what the wrappers are meant to compute.
#pragma once

#include "tests/gpu/gpu_model.h"
#include "tests/gpu/gpu_test_util.h"

#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/collectives/communicator.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/grad_scaler.h>
#include <tandem/runtime/sharded_data_parallel.h>

#include <torch/optim/adamw.h>

#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace tandem::gpu_test {

enum class Wrapper { kPlain, kDdp, kZero1, kZero2, kZero3 };
std::string wrapper_name(Wrapper w);
// gtest's and ctest's name of a test parameterised by a wrapper.
inline void PrintTo(Wrapper w, std::ostream* os) { *os << wrapper_name(w); }

struct Recipe {
  ModelSize size = k10M;
  ModelOptions model;                       // dropout, activation checkpointing
  int steps = 30;
  int64_t rows = 16;                        // batch rows per rank
  at::ScalarType param_dtype = at::kFloat;  // kHalf / kBFloat16: low-precision model, fp32 masters
  bool scaler = false;                      // dynamic loss scaling (GradScaler)
  int64_t growth_interval = 2000;           // GradScaler's; small ones make it overflow and back off
  at::ScalarType autocast = at::kFloat;     // kBFloat16 / kHalf: forward and loss under autocast
  double clip = 0;                          // > 0: clip the global gradient norm to this
  uint64_t seed = 7;                        // the initial weights
};

// One rank's training under one wrapper. Thread-safety: one thread per trainer.
class Trainer {
 public:
  // `comm`: the wrapper's world (null for the plain loop). `world`: how many ranks' batches a step
  // averages; the plain loop computes all of them itself.
  Trainer(const Recipe& recipe, Wrapper wrapper, std::shared_ptr<NetImpl> model,
          std::shared_ptr<Communicator> comm, int world);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step on this rank's batch of step `step` (the plain loop: on every rank's).
  void step(int step);

  // The fp32 values the optimizer steps (the masters under mixed precision), by parameter name:
  // this rank's slice of each under sharding, cloned.
  std::vector<MasterSlice> masters() const;
  torch::optim::AdamW& optimizer() { return *opt_; }
  // Registers what a training program checkpoints: the model (masters), the optimizer, the
  // scaler, and DistributedDataParallel's bucket plan.
  void register_checkpoint(CheckpointManager& ckpt);

  const std::vector<double>& norms() const { return norms_; }     // per step, when clipping
  const std::vector<bool>& stepped() const { return stepped_; }  // false: the scaler skipped it

 private:
  at::Tensor forward(const at::Tensor& x);
  // The loss of batch `b` through `plain` (the plain loop) or the wrapper (null).
  at::Tensor loss_of(NetImpl* plain, const Batch& b);
  void backward(const at::Tensor& loss);
  void plain_backward(int step);
  void finish_step();

  Recipe recipe_;
  Wrapper wrapper_;
  std::shared_ptr<NetImpl> model_;
  std::shared_ptr<NetImpl> low_;  // the plain loop's low-precision copy under mixed precision
  std::shared_ptr<Communicator> comm_;
  int rank_ = 0;
  int world_ = 1;
  std::unique_ptr<DistributedDataParallel<NetImpl>> ddp_;
  std::unique_ptr<ShardedDataParallel<NetImpl>> sdp_;
  std::vector<at::Tensor> params_;  // what the optimizer steps
  std::unique_ptr<torch::optim::AdamW> opt_;
  std::unique_ptr<GradScaler> scaler_;
  std::vector<double> norms_;
  std::vector<bool> stepped_;
};

struct RunResult {
  std::map<std::string, at::Tensor> masters;  // every parameter whole, fp32
  std::vector<double> norms;
  std::vector<bool> stepped;
  std::string replica_difference;  // DDP at world > 1: "" when every rank holds rank 0's bits
};

// `recipe.steps` steps from the weights of `recipe.seed`. World 1: one rank over NCCL, in this
// process; world > 1: one process per rank under tandemrun, sharing the one GPU over Gloo
// (host-staged), as real jobs run - ranks as threads of one process would share libtorch's one
// autograd thread per device, and one rank's end-of-backward wait for another would hang both;
// the plain loop: one loop over `world` ranks' batches, in this process. Dropout needs world 1
// (the plain loop draws every rank's masks from one generator). Throws std::runtime_error when a
// rank process fails, with its output.
RunResult train(const Recipe& recipe, Wrapper wrapper, int world);

// The rank processes of train(): `gpu_rank_worker --out DIR <recipe_args>` trains one rank of
// the tandemrun world and writes its slices, norms and skipped steps to DIR/rank<R>.{pt,txt}.
std::vector<std::string> recipe_args(const Recipe& recipe, Wrapper wrapper);
int rank_worker_main(int argc, char** argv);

// The weights every run starts from, flattened, by name (what RunResult::masters holds).
std::map<std::string, at::Tensor> initial_masters(const Recipe& recipe);

}  // namespace tandem::gpu_test
