// The Gloo communicator on CUDA tensors, staged through pinned host memory (ctest label gpu; every
// test skips where libtorch sees no CUDA device): two ranks as threads on the one GPU, every
// collective and dtype bitwise equal to the same op on CPU tensors, over shared memory and over
// TCP; the producer's and the consumer's streams ordered by events; tensors the caller drops right
// after the call. The suite GlooCudaStagingWithoutDevice (label unit) runs only where there is no
// device: a CUDA tensor there is a clear error, never a crash.
#include "tests/support/test_support.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/communicator.h>

#include <ATen/ATen.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <string>

namespace tandem {
namespace {

using testing::run_ranks;

constexpr int kWorld = 2;
constexpr int64_t kSleepCycles = 200 * 1000 * 1000;  // ~0.1 s of GPU time: the producer is late

// Values whose float sums depend on the order they are added in (so "bitwise" means something);
// small integers for the integer dtypes and the product.
at::Tensor values(int rank, int64_t n, at::ScalarType dtype, ReduceOp op = ReduceOp::kSum) {
  const auto i = at::arange(n, at::kLong);
  if (op == ReduceOp::kProduct) return ((i + rank) % 2 + 1).to(dtype);
  if (!at::isFloatingType(dtype)) return ((i * 7 + rank * 3) % 5 + 1).to(dtype);
  return (((i * 7919 + rank * 104729) % 1009).to(at::kDouble) / 37.0 - 13.3).to(dtype);
}

std::string what(const char* op, at::ScalarType dtype, int rank, const std::string& more = "") {
  return std::string(op) + " " + c10::toString(dtype) + " rank " + std::to_string(rank) + more;
}

void expect_bitwise(const at::Tensor& cuda, const at::Tensor& cpu, const std::string& label) {
  ASSERT_TRUE(cuda.is_cuda()) << label;
  EXPECT_TRUE(at::equal(cuda.cpu(), cpu)) << label << "\n cuda " << cuda.cpu().slice(0, 0, 6)
                                          << "\n cpu  " << cpu.slice(0, 0, 6);
}

class GlooCudaStaging : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "libtorch sees no CUDA device";
  }
  GlooOptions options() const {
    GlooOptions o;
    o.shared_memory = GetParam();
    o.timeout = std::chrono::seconds(60);
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(SharedMemoryAndTcp, GlooCudaStaging, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "shm" : "tcp"; });

TEST_P(GlooCudaStaging, EveryCollectiveAndDtypeIsBitwiseTheCpuResult) {
  run_ranks(kWorld, [&](Communicator& comm) {
    const int rank = comm.rank();
    for (auto dtype : testing::kAllDtypes) {
      // 70000 elements take the ring on TCP, 1001 the small-message algorithm.
      for (int64_t n : {int64_t{1001}, int64_t{70000}}) {
        for (auto op : testing::kAllReduceOps) {
          if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
          auto cpu = values(rank, n, dtype, op);
          auto cuda = cpu.cuda();
          comm.allreduce(cpu, op)->wait();
          comm.allreduce(cuda, op)->wait();
          expect_bitwise(cuda, cpu, what("allreduce", dtype, rank, std::string(" ") + to_string(op)));

          auto cpu_out = at::zeros({n}, dtype);
          auto cuda_out = cpu_out.cuda();
          auto in = values(rank, kWorld * n, dtype, op);
          comm.reduce_scatter(cpu_out, in, op)->wait();
          comm.reduce_scatter(cuda_out, in.cuda(), op)->wait();
          expect_bitwise(cuda_out, cpu_out, what("reduce_scatter", dtype, rank, std::string(" ") + to_string(op)));
        }
      }
      for (int root = 0; root < kWorld; ++root) {
        auto cpu = values(rank, 3001, dtype);
        auto cuda = cpu.cuda();
        comm.broadcast(cpu, root)->wait();
        comm.broadcast(cuda, root)->wait();
        expect_bitwise(cuda, cpu, what("broadcast", dtype, rank, " root " + std::to_string(root)));
      }
      auto in = values(rank, 777, dtype);
      auto cpu_out = at::zeros({kWorld * 777}, dtype);
      auto cuda_out = cpu_out.cuda();
      comm.allgather(cpu_out, in)->wait();
      comm.allgather(cuda_out, in.cuda())->wait();
      expect_bitwise(cuda_out, cpu_out, what("allgather", dtype, rank));

      // Point to point: rank 0 sends its CUDA tensor, rank 1 receives into a CUDA tensor.
      auto sent = values(0, 4097, dtype);
      if (rank == 0) {
        comm.send(sent.cuda(), 1, 7)->wait();
      } else {
        auto got = at::zeros({4097}, dtype).cuda();
        comm.recv(got, 0, 7)->wait();
        expect_bitwise(got, sent, what("recv", dtype, rank));
      }
    }
  }, options());
}

TEST_P(GlooCudaStaging, NonContiguousTensorsAreStagedAndCopiedBack) {
  run_ranks(kWorld, [&](Communicator& comm) {
    auto base = (at::arange(12, at::kFloat).reshape({3, 4}) + comm.rank()).cuda();
    auto t = base.t();
    ASSERT_FALSE(t.is_contiguous());
    comm.allreduce(t, ReduceOp::kSum)->wait();
    EXPECT_TRUE(at::equal(base.cpu(), at::arange(12, at::kFloat).reshape({3, 4}) * 2 + 1));
    auto host = at::full({10}, -1.0f).cuda();
    auto every_other = host.slice(0, 0, 10, 2);
    if (comm.rank() == 0) every_other.fill_(5.0f);
    comm.broadcast(every_other, 0)->wait();
    EXPECT_TRUE(at::equal(host.cpu(), at::tensor({5.f, -1.f, 5.f, -1.f, 5.f, -1.f, 5.f, -1.f, 5.f, -1.f})));
  }, options());
}

// The producer writes on stream A long after the call was issued (a sleep first); the consumer
// reads on stream B right after wait(). Staging that did not wait for A would send zeros; a wait()
// that did not order B after the copy back would read the old values.
TEST_P(GlooCudaStaging, ProducerAndConsumerStreamsAreOrderedByEvents) {
  run_ranks(kWorld, [&](Communicator& comm) {
    const int64_t n = 16 << 20;  // 64 MiB of float32: the copy back takes a while
    auto producer = c10::cuda::getStreamFromPool(false, 0);
    auto consumer = c10::cuda::getStreamFromPool(false, 0);
    for (int round = 0; round < 3; ++round) {
      at::Tensor t, gathered, in;
      WorkPtr reduce, gather;
      {
        c10::cuda::CUDAStreamGuard on(producer);
        t = at::zeros({n}, at::kFloat).cuda();
        in = at::zeros({1000}, at::kLong).cuda();
        gathered = at::zeros({kWorld * 1000}, at::kLong).cuda();
        at::cuda::sleep(kSleepCycles);
        t.fill_(comm.rank() + 1.0f + round);
        in.fill_(comm.rank() + 10 * round);
        reduce = comm.allreduce(t, ReduceOp::kSum);
        gather = comm.allgather(gathered, in);
      }
      c10::cuda::CUDAStreamGuard on(consumer);
      reduce->wait();
      gather->wait();
      auto seen = t.clone();  // on the consumer stream
      auto seen_gathered = gathered.clone();
      consumer.synchronize();
      const float want = 1.0f + round + 2.0f + round;
      EXPECT_TRUE(at::equal(seen.cpu(), at::full({n}, want))) << "round " << round << ": "
                                                                << seen.cpu().slice(0, 0, 4);
      EXPECT_TRUE(at::equal(seen_gathered.cpu().slice(0, 0, 1000), at::full({1000}, 10 * round, at::kLong)));
      EXPECT_TRUE(at::equal(seen_gathered.cpu().slice(0, 1000), at::full({1000}, 1 + 10 * round, at::kLong)));
    }
  }, options());
}

// Point to point with a late producer on the sender and a consumer stream on the receiver.
TEST_P(GlooCudaStaging, SendAndRecvFollowTheirStreams) {
  run_ranks(kWorld, [&](Communicator& comm) {
    auto side = c10::cuda::getStreamFromPool(false, 0);
    c10::cuda::CUDAStreamGuard on(side);
    auto t = at::zeros({1 << 20}, at::kFloat).cuda();
    if (comm.rank() == 0) {
      at::cuda::sleep(kSleepCycles);
      t.fill_(3.5f);
      auto work = comm.send(t, 1, 3);
      t.reset();  // the staging holds it
      work->wait();
    } else {
      comm.recv(t, 0, 3)->wait();
      auto seen = t.clone();
      side.synchronize();
      EXPECT_TRUE(at::equal(seen.cpu(), at::full({1 << 20}, 3.5f)));
    }
  }, options());
}

// Tensors dropped right after the call: the op still reads the input the producer wrote, and the
// copy back never lands in memory the caller allocated since.
TEST_P(GlooCudaStaging, TensorsDroppedRightAfterTheCallStayValidUntilTheCopiesFinished) {
  run_ranks(kWorld, [&](Communicator& comm) {
    const int64_t n = 4 << 20;
    for (int round = 0; round < 3; ++round) {
      auto in = at::empty({n}, at::kFloat).cuda();
      auto out = at::zeros({kWorld * n}, at::kFloat).cuda();
      at::cuda::sleep(kSleepCycles);
      in.fill_(comm.rank() + 1.0f);
      auto gather = comm.allgather(out, in);
      in.reset();  // its memory may go to the next allocation of the same size at once
      auto reused = at::empty({n}, at::kFloat).cuda();
      reused.fill_(-7.0f);

      auto dropped = at::full({n}, 1.0f).cuda();
      auto reduce = comm.allreduce(dropped, ReduceOp::kSum);
      dropped.reset();
      auto fresh = at::empty({n}, at::kFloat).cuda();
      fresh.fill_(42.0f);

      gather->wait();
      reduce->wait();
      EXPECT_TRUE(at::equal(out.slice(0, 0, n).cpu(), at::full({n}, 1.0f))) << "round " << round;
      EXPECT_TRUE(at::equal(out.slice(0, n).cpu(), at::full({n}, 2.0f))) << "round " << round;
      c10::cuda::getCurrentCUDAStream().synchronize();
      c10::cuda::device_synchronize();
      EXPECT_TRUE(at::equal(reused.cpu(), at::full({n}, -7.0f))) << "round " << round;
      EXPECT_TRUE(at::equal(fresh.cpu(), at::full({n}, 42.0f))) << "round " << round;
    }
  }, options());
}

TEST_P(GlooCudaStaging, TensorsOfOneOpOnDifferentDevicesAreRefusedByName) {
  run_ranks(1, [&](Communicator& comm) {
    auto out = at::zeros({4}, at::kFloat).cuda();
    auto in = at::ones({4}, at::kFloat);
    try {
      comm.allgather(out, in);
      ADD_FAILURE() << "allgather with a CUDA output and a CPU input was accepted";
    } catch (const CommError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("'output' is on cuda:0"), std::string::npos) << m;
      EXPECT_NE(m.find("'input' on cpu"), std::string::npos) << m;
    }
    comm.allgather(out, in.cuda())->wait();  // still usable
    EXPECT_TRUE(at::equal(out.cpu(), at::ones({4})));
  }, options());
}

// Where libtorch has its CUDA part but no device (the CPU machines): a tensor that claims to be on
// cuda:0 (no memory behind it; a real one cannot be made there).
at::Tensor tensor_claiming_cuda() {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0,
                       c10::DataPtr(nullptr, c10::Device(c10::kCUDA, 0)), nullptr, false);
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CUDA),
      caffe2::TypeMeta::Make<float>());
  return t;
}

TEST(GlooCudaStagingWithoutDevice, ACudaTensorIsAClearErrorAndTheCommunicatorStaysUsable) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has a CUDA device";
  auto comm = connect_gloo(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  const auto fake = tensor_claiming_cuda();
  ASSERT_TRUE(fake.is_cuda());
  for (const char* op : {"allreduce", "broadcast", "allgather", "reduce_scatter"}) {
    const std::string name = op;
    try {
      if (name == "allreduce") comm->allreduce(fake, ReduceOp::kSum);
      if (name == "broadcast") comm->broadcast(fake, 0);
      if (name == "allgather") comm->allgather(fake, fake);
      if (name == "reduce_scatter") comm->reduce_scatter(fake, fake, ReduceOp::kSum);
      ADD_FAILURE() << op << " on a CUDA tensor without a device was accepted";
    } catch (const CommError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("tandem: ") + op + ": staging tensors on cuda:0"), std::string::npos) << m;
      EXPECT_NE(m.find("torch::cuda::is_available()"), std::string::npos) << m;
    }
  }
  auto t = at::ones({3});
  comm->allreduce(t, ReduceOp::kSum)->wait();  // refused before it was numbered: still in step
  EXPECT_TRUE(at::equal(t, at::ones({3})));
}

}  // namespace
}  // namespace tandem
