// NCCL communicator on a real GPU (ctest label `gpu`): skipped without a CUDA device or without a
// CUDA-enabled libtorch. One GPU allows one rank per process: these tests run a world of one
// (NCCL refuses two ranks on one device).
#include <tandem/base/errors.h>
#include <tandem/collectives/nccl_communicator.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace tandem {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && at::hasCUDA();
}

TEST(Nccl, WorldOfOneRunsEveryCollective) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device or libtorch built without CUDA";
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto comm = connect_nccl(store, 0, 1);
  EXPECT_EQ(comm->backend(), "nccl");
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  auto t = at::arange(1000, opts);
  comm->allreduce(t, ReduceOp::kSum)->wait();
  EXPECT_TRUE(at::equal(t.cpu(), at::arange(1000, at::kFloat)));
  comm->allreduce(t, ReduceOp::kAvg)->wait();
  EXPECT_TRUE(at::equal(t.cpu(), at::arange(1000, at::kFloat)));
  auto strided = at::arange(12, opts).reshape({3, 4}).t();
  comm->broadcast(strided, 0)->wait();
  EXPECT_TRUE(at::equal(strided.cpu(), at::arange(12, at::kFloat).reshape({3, 4}).t()));
  auto out = at::zeros({10}, opts);
  comm->allgather(out, at::ones({10}, opts))->wait();
  EXPECT_TRUE(at::equal(out.cpu(), at::ones({10})));
  auto rs = at::zeros({10}, opts);
  comm->reduce_scatter(rs, at::full({10}, 3.0, opts), ReduceOp::kMax)->wait();
  EXPECT_TRUE(at::equal(rs.cpu(), at::full({10}, 3.0f)));
  for (auto dtype : {at::kHalf, at::kBFloat16, at::kDouble, at::kInt, at::kLong, at::kByte}) {
    auto x = at::ones({64}, at::TensorOptions().device(at::kCUDA).dtype(dtype));
    comm->allreduce(x, ReduceOp::kSum)->wait();
    EXPECT_TRUE(at::equal(x.cpu(), at::ones({64}, dtype))) << c10::toString(dtype);
  }
  comm->barrier()->wait();
  auto sub = comm->split(0, 0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
}

TEST(Nccl, RejectsCpuTensorsAndTags) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device or libtorch built without CUDA";
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto comm = connect_nccl(store, 0, 1);
  try {
    comm->allreduce(at::ones({4}));
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("works on cuda tensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
