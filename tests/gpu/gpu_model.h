// The model and data of the gpu tests: an MLP of width x width Linear layers whose hidden layers
// are ShardedUnits (stage 3 gathers one layer at a time), at the two sizes issue 26 names and one
// whose widths are no multiple of 64 (issue 37), with
// optional dropout and activation checkpointing; batches drawn on the CPU from generators of
// their own, so every run, thread and device sees the same samples.
#pragma once

#include "tests/gpu/gpu_test_util.h"

#include <tandem/runtime/activation_checkpoint.h>
#include <tandem/runtime/sharded_data_parallel.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace tandem::gpu_test {

struct ModelSize {
  const char* name;
  int64_t width;  // every layer is Linear(width, width)
  int hidden;     // hidden layers between the input and the output layer
};
// 10 x Linear(1024, 1024): 10,496,000 parameters.
inline constexpr ModelSize k10M{"10M", 1024, 8};
// 8 x Linear(4096, 4096): 134,250,496 parameters.
inline constexpr ModelSize k130M{"130M", 4096, 6};
// 4 x Linear(1000, 1000): a bias of 1000 floats (4000 bytes) puts the next parameter 160 bytes
// past a 256-byte boundary unless the wrappers' flat buffers pad it. cuBLAS picks kernels by
// pointer alignment and the plain loop's own tensors are aligned, so without the padding both
// sides would run other kernels and differ in bits (issue 37).
inline constexpr ModelSize kOdd{"odd", 1000, 2};

// The size named `name` (one of the above); std::invalid_argument otherwise.
inline const ModelSize& model_size(const std::string& name) {
  for (const ModelSize* s : {&k10M, &k130M, &kOdd}) {
    if (name == s->name) return *s;
  }
  throw std::invalid_argument("no model size '" + name + "' (10M, 130M, odd)");
}

struct ModelOptions {
  double dropout = 0;          // after every hidden layer's ReLU
  bool checkpointed = false;   // each hidden layer under tandem::activation_checkpoint
  bool replay_rng = true;      // ActivationCheckpointOptions::preserve_rng_state
};

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t width, double dropout) : dropout(dropout) {
    fc = register_module("fc", torch::nn::Linear(width, width));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(fc(x));
    return dropout > 0 ? torch::dropout(h, dropout, is_training()) : h;
  }
  torch::nn::Linear fc{nullptr};
  double dropout;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl(ModelSize size, ModelOptions options) : options(options) {
    in = register_module("in", torch::nn::Linear(size.width, size.width));
    for (int i = 0; i < size.hidden; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i),
                                       ShardedUnit<BlockImpl>(Block(size.width, options.dropout))));
    }
    out = register_module("out", torch::nn::Linear(size.width, size.width));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = in(x);
    for (auto& b : blocks) {
      if (options.checkpointed) {
        ActivationCheckpointOptions o;
        o.preserve_rng_state = options.replay_rng;
        h = activation_checkpoint([&b](const at::Tensor& t) { return b(t); }, h, o);
      } else {
        h = b(h);
      }
    }
    return out(h);
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  std::vector<ShardedUnit<BlockImpl>> blocks;
  ModelOptions options;
};

// A model on the test device (the GPU) whose weights depend on `seed` only. Built under one lock: the default
// generator is process-wide and ranks run as threads.
inline std::shared_ptr<NetImpl> make_net(const ModelSize& size, uint64_t seed,
                                         ModelOptions options = {}) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(seed);
  auto net = std::make_shared<NetImpl>(size, options);
  net->to(test_device());
  return net;
}

struct Batch {
  at::Tensor x, y;
};

// Rank `rank`'s batch of step `step`, on the test device (the GPU).
inline Batch batch_of(const ModelSize& size, int rank, int step, int64_t rows = 16) {
  auto gen = at::detail::createCPUGenerator(1000 + 97 * static_cast<uint64_t>(rank) + step);
  at::Tensor x = at::randn({rows, size.width}, gen);
  at::Tensor y = at::randn({rows, size.width}, gen);
  return {x.to(test_device()), y.to(test_device())};
}

}  // namespace tandem::gpu_test
