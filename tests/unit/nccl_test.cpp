// NCCL communicator on a real GPU (ctest label `gpu`): skipped without a CUDA device or without a
// CUDA-enabled libtorch. One GPU allows one rank per process: these tests run a world of one
// (NCCL refuses two ranks on one device). At world 1 an out-of-place op (allgather, reduce_scatter)
// still copies on the NCCL stream, so stream ordering shows in its results: a host function that
// holds a stream for a while makes a missing dependency give wrong values every time, not in a
// rare race.
#include <tandem/base/errors.h>
#include <tandem/collectives/nccl_communicator.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && at::hasCUDA();
}

std::shared_ptr<Communicator> world_of_one(std::chrono::milliseconds timeout = std::chrono::minutes(1)) {
  NcclOptions options;
  options.timeout = timeout;
  return connect_nccl(c10::make_intrusive<c10d::HashStore>(), 0, 1, options);
}

at::TensorOptions cuda_float() { return at::TensorOptions().device(at::kCUDA, 0).dtype(at::kFloat); }

// Holds `stream` for `ms` milliseconds: what is queued after this on it runs that much later.
void stall(const c10::cuda::CUDAStream& stream, int ms) {
  auto sleep = [](void* arg) {
    std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::intptr_t>(arg)));
  };
  ASSERT_EQ(cudaLaunchHostFunc(stream.stream(), sleep, reinterpret_cast<void*>(std::intptr_t{ms})),
            cudaSuccess);
}

// Holds `stream` until `*release` is set (or 20 s passed, so a failed test still ends).
void hold(const c10::cuda::CUDAStream& stream, std::atomic<bool>* release) {
  auto wait = [](void* arg) {
    auto* flag = static_cast<std::atomic<bool>*>(arg);
    const auto give_up = Clock::now() + std::chrono::seconds(20);
    while (!flag->load() && Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  ASSERT_EQ(cudaLaunchHostFunc(stream.stream(), wait, release), cudaSuccess);
}

TEST(Nccl, WorldOfOneRunsEveryCollective) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device or libtorch built without CUDA";
  auto comm = world_of_one();
  EXPECT_EQ(comm->backend(), "nccl");
  const auto opts = cuda_float();
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

// The op waits for the stream that produced its input (not the default stream), and wait() makes
// the consumer's stream wait for the op, including the copy back into a non-contiguous output.
TEST(Nccl, WaitsForTheProducerStreamAndOrdersTheConsumerStream) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device or libtorch built without CUDA";
  auto comm = world_of_one();
  const auto opts = cuda_float();
  constexpr int64_t n = 1 << 20;
  auto in = at::zeros({n}, opts);
  auto out = at::zeros({n}, opts);
  auto strided_out = at::zeros({512, 2048}, opts).t();  // 2048 x 512, not contiguous
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto producer = c10::cuda::getStreamFromPool(false, 0);
  auto consumer = c10::cuda::getStreamFromPool(false, 0);
  WorkPtr gathered, scattered;
  {
    c10::cuda::CUDAStreamGuard on_producer(producer);
    stall(producer, 300);
    in.copy_(at::arange(n, opts));
    gathered = comm->allgather(out, in);
    scattered = comm->reduce_scatter(strided_out, in, ReduceOp::kSum);
  }
  at::Tensor seen, seen_strided;
  {
    c10::cuda::CUDAStreamGuard on_consumer(consumer);
    gathered->wait();
    scattered->wait();
    seen = out.clone();
    seen_strided = strided_out.clone();
  }
  consumer.synchronize();
  const auto expected = at::arange(n, at::kFloat);
  EXPECT_TRUE(at::equal(seen.cpu(), expected));
  EXPECT_TRUE(at::equal(seen_strided.cpu(), expected.reshape({2048, 512})));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Holds the NCCL stream: its next op waits for a stalled stream. Returns that op's Work.
WorkPtr block_nccl_stream(Communicator& comm, const c10::cuda::CUDAStream& slow, int ms) {
  const auto opts = cuda_float();
  auto in = at::zeros({16}, opts);
  auto out = at::zeros({16}, opts);
  c10::cuda::CUDAStreamGuard on_slow(slow);
  stall(slow, ms);
  return comm.allgather(out, in);  // `in` and `out` are dropped at once: the op keeps them
}

TEST(Nccl, InputDroppedRightAfterTheCallIsStillRead) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device or libtorch built without CUDA";
  auto comm = world_of_one();
  const auto opts = cuda_float();
  constexpr int64_t n = 1 << 20;  // 4 MiB: the caching allocator's large pool, reused best-fit
  auto out = at::zeros({n}, opts);
  auto slow = c10::cuda::getStreamFromPool(false, 0);
  auto producer = c10::cuda::getStreamFromPool(false, 0);
  WorkPtr first = block_nccl_stream(*comm, slow, 300);
  WorkPtr second;
  at::Tensor next;
  {
    c10::cuda::CUDAStreamGuard on_producer(producer);
    auto in = at::full({n}, 3.0f, opts);
    second = comm->allgather(out, in);
    in.reset();                          // its memory would go back to the producer's pool...
    next = at::full({n}, 9.0f, opts);    // ...and be handed out and overwritten here at once
  }
  second->wait();
  EXPECT_TRUE(at::equal(out.cpu(), at::full({n}, 3.0f)));
  producer.synchronize();
  EXPECT_TRUE(at::equal(next.cpu(), at::full({n}, 9.0f)));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(Nccl, OutputDroppedRightAfterTheCallIsNotHandedOutEarly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device or libtorch built without CUDA";
  auto comm = world_of_one();
  const auto opts = cuda_float();
  constexpr int64_t n = 1 << 20;
  auto in = at::full({n}, 3.0f, opts);
  auto slow = c10::cuda::getStreamFromPool(false, 0);
  auto producer = c10::cuda::getStreamFromPool(false, 0);
  WorkPtr first = block_nccl_stream(*comm, slow, 300);
  WorkPtr second;
  at::Tensor next;
  {
    c10::cuda::CUDAStreamGuard on_producer(producer);
    auto out = at::zeros({n}, opts);
    second = comm->allgather(out, in);
    out.reset();                        // NCCL has not written it yet
    next = at::full({n}, 5.0f, opts);  // must not get its memory before NCCL is done with it
  }
  second->wait(std::chrono::seconds(30));  // the host waits too: NCCL has written by now
  producer.synchronize();
  EXPECT_TRUE(at::equal(next.cpu(), at::full({n}, 5.0f)));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(Nccl, WaitOrdersStreamsWithoutBlockingTheHostUnlessGivenATimeout) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device or libtorch built without CUDA";
  auto comm = world_of_one();
  auto slow = c10::cuda::getStreamFromPool(false, 0);
  WorkPtr work = block_nccl_stream(*comm, slow, 1000);
  const auto start = Clock::now();
  work->wait();  // queues the wait on this thread's current stream and returns
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
  EXPECT_FALSE(work->is_completed());
  EXPECT_FALSE(work->completed_at().has_value());
  work->wait(std::chrono::seconds(30));  // an explicit timeout: the host waits for the op
  EXPECT_TRUE(work->is_completed());
  EXPECT_TRUE(work->completed_at().has_value());
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(900));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// An op that cannot finish (its input's stream is held) fails by the watchdog after the timeout,
// with nobody waiting on the host; the communicator is aborted and refuses later ops.
TEST(Nccl, WatchdogFailsAnOpPastTheTimeoutAndBreaksTheCommunicator) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device or libtorch built without CUDA";
  auto comm = world_of_one(std::chrono::milliseconds(300));
  const auto opts = cuda_float();
  auto in = at::ones({16}, opts);
  auto out = at::zeros({16}, opts);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::atomic<bool> release{false};
  auto producer = c10::cuda::getStreamFromPool(false, 0);
  WorkPtr work;
  {
    c10::cuda::CUDAStreamGuard on_producer(producer);
    hold(producer, &release);
    work = comm->allgather(out, in);
  }
  const auto give_up = Clock::now() + std::chrono::seconds(15);
  while (!work->is_completed() && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const bool failed_in_time = work->is_completed();
  release = true;  // the stream drains; NCCL's abort returns
  ASSERT_TRUE(failed_in_time) << "the watchdog did not end the op within 15 s";
  try {
    work->wait();
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("allgather #0"), std::string::npos) << what;
    EXPECT_NE(what.find("did not complete within 0.30 s on rank 0"), std::string::npos) << what;
    EXPECT_NE(what.find("aborted"), std::string::npos) << what;
    EXPECT_NE(what.find("--set comm.timeout_s="), std::string::npos) << what;
  }
  try {
    comm->allreduce(out);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce #1 (sum, 64 B float32) on ranks [0] refused"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("did not complete within"), std::string::npos) << e.what();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(Nccl, RejectsCpuTensorsAndTags) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device or libtorch built without CUDA";
  auto comm = world_of_one();
  try {
    comm->allreduce(at::ones({4}));
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    // The device type as c10 spells it ("CUDA"), the tensor's device as torch prints it ("cpu").
    EXPECT_NE(std::string(e.what()).find(
                  "allreduce: argument 'tensor' is on cpu but the nccl communicator works on CUDA "
                  "tensors"),
              std::string::npos)
        << e.what();
  }
  try {
    comm->send(at::ones({4}, cuda_float()), 0, 3);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("send: tag 3, but NCCL has no message tags"),
              std::string::npos)
        << e.what();
  }
}

// send_recv() is one NCCL group (issue 37): a rank's send to itself and its receive from itself
// complete together (ungrouped, the send would wait for a receive queued behind it), and a
// non-contiguous receive gets its values back. NCCL offers no tags.
TEST(Nccl, SendRecvIsOneGroupAndOffersNoTags) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device or libtorch built without CUDA";
  auto comm = world_of_one();
  EXPECT_FALSE(comm->p2p_tags(c10::Device(c10::kCUDA, 0)));
  const at::Tensor out = at::arange(12, cuda_float()).view({3, 4});
  at::Tensor in = at::zeros({4, 3}, cuda_float()).t();  // 3 x 4, not contiguous
  comm->send_recv({{P2POp::Kind::kSend, out, 0}, {P2POp::Kind::kRecv, in, 0}})
      ->wait(std::chrono::seconds(20));
  EXPECT_TRUE(in.equal(out));
}

// split() learns its members from an op of its parent, watched and bounded like any other: the
// child of a world of one holds world rank 0 and works; a negative colour opts out.
TEST(Nccl, SplitLearnsItsMembersFromAWatchedOp) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device or libtorch built without CUDA";
  auto comm = world_of_one();
  auto child = comm->split(0, 5);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->rank(), 0);
  EXPECT_EQ(child->world_rank(0), 0);
  at::Tensor t = at::ones({4}, cuda_float());
  child->allreduce(t)->wait(std::chrono::seconds(20));
  EXPECT_EQ(t.sum().item<float>(), 4.0f);
  EXPECT_EQ(comm->split(-1, 0), nullptr);
}

}  // namespace
}  // namespace tandem
