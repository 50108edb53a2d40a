// Shared by the gpu tests: the skip without a GPU, a world of one over NCCL, and exact
// comparisons of parameters and optimizer state gathered from every rank.
#pragma once

#include <tandem/runtime/init.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tandem::gpu_test {

// Where the tests put models and data: cuda:0. With TANDEM_GPU_TEST_CPU set, the CPU instead, and
// the tests run without a GPU (over Gloo where they would use NCCL): a rehearsal that checks the
// tests' own logic on a CPU machine, no evidence about CUDA.
c10::Device test_device();

// Skips every test of the fixture where torch sees no CUDA device (unless rehearsing on the CPU).
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override;
};
template <class Param>
class GpuTestWithParam : public GpuTest, public ::testing::WithParamInterface<Param> {};

// A world of one as a training program gets it with comm.backend = nccl: CUDA tensors over NCCL,
// CPU tensors (the checkpoint manager's) over Gloo (all over Gloo when rehearsing on the CPU).
Distributed nccl_world_of_one();

// Elements [begin, begin + data.numel()) of the flattened parameter `name` of `numel` elements,
// as one rank holds them (all of them, or its shard's part).
struct MasterSlice {
  std::string name;
  int64_t numel = 0;
  int64_t begin = 0;
  at::Tensor data;
};
// Every parameter whole, from the slices of all ranks (rank order; a later rank's overlapping
// elements win). Throws std::runtime_error when some element of a parameter is in no slice.
std::map<std::string, at::Tensor> assemble(const std::vector<std::vector<MasterSlice>>& ranks);

// "" when `a` and `b` hold the same names and, for each, tensors equal element for element;
// otherwise the first difference: the name and how many elements differ, by how much at most.
std::string difference(const std::map<std::string, at::Tensor>& a,
                       const std::map<std::string, at::Tensor>& b);
std::string difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);
// The largest |a - b| over every element of every tensor (same names required).
double max_difference(const std::map<std::string, at::Tensor>& a,
                      const std::map<std::string, at::Tensor>& b);

// AdamW's state of every parameter of `opt` in parameter order: exp_avg, exp_avg_sq and the step
// count (an int64 CPU tensor), cloned. Throws std::runtime_error for a parameter without state.
std::vector<at::Tensor> adamw_state(torch::optim::AdamW& opt);

}  // namespace tandem::gpu_test
