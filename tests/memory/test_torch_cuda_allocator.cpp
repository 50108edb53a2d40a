// tandem as libtorch's CUDA allocator (ctest labels memory;gpu): libtorch's CUDA tensors come
// from the pool, with statistics, snapshots and leak reports; recordStream is honoured.
// Its own executable, because the allocator must be installed before the process's first CUDA
// allocation: every test calls install_once() before any CUDA work. ctest runs each test in a
// process of its own. Skipped without a GPU, without tandem's CUDA part, or when libtorch sees no
// device.
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <tandem/base/errors.h>
#include <tandem/memory/cuda_allocator.h>
#include <tandem/memory/leak_detector.h>
#include <tandem/memory/snapshot.h>

namespace tmem = tandem::memory;

// External linkage + noinline: the executable exports its symbols (ENABLE_EXPORTS), so these
// names appear in the symbolised stacks of the leak report.
__attribute__((noinline)) torch::Tensor keep_alive_on_gpu() {
  return torch::full({1000, 1000}, 7.0f, torch::kCUDA);  // 4,000,000 bytes
}
__attribute__((noinline)) void planted_gpu_leak(std::vector<torch::Tensor>& keep) {
  keep.push_back(torch::ones({64, 64}, torch::kCUDA));  // 16 KiB kept every step
}

namespace {

constexpr auto kAll = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);

struct Installation {
  std::string skip, error;
  std::vector<std::shared_ptr<tmem::MemoryStack>> stacks;
};

// Installs tandem with tracking (every stack captured) and an 8 GiB cap, once per process.
const Installation& install_once() {
  static const Installation installation = [] {
    Installation s;
    if (!tmem::cuda_allocator_available(&s.skip)) return s;
    s.skip.clear();
    tmem::MemoryStackOptions o;
    o.limit_bytes = 8ull << 30;
    o.tracking = true;
    o.tracking_options.stacks = tmem::StackCapture::kAll;
    o.tracking_options.max_frames = 64;
    o.tracking_options.report_at_exit = false;
    try {
      s.stacks = tmem::install_cuda_allocator(o);
    } catch (const std::exception& e) {
      s.error = e.what();
    }
    return s;
  }();
  return installation;
}

#define INSTALL_OR_SKIP()                                                               \
  do {                                                                                  \
    const Installation& inst = install_once();                                          \
    if (!inst.skip.empty()) GTEST_SKIP() << "tandem's CUDA allocator: " << inst.skip;   \
    ASSERT_TRUE(inst.error.empty()) << inst.error;                                      \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "libtorch sees no CUDA device";   \
  } while (0)

tmem::MemoryStack& device0() { return *install_once().stacks.at(0); }

// Addresses of the live allocations tracking knows.
std::set<std::uintptr_t> live_addresses() {
  std::set<std::uintptr_t> out;
  for (const auto& r : device0().tracking()->live_allocations()) out.insert(r.address);
  return out;
}

// Some libtorch work: two products and a ReLU, checked against the CPU.
void some_work() {
  auto a = torch::randn({512, 512}, torch::kCUDA);
  auto b = torch::randn({512, 512}, torch::kCUDA);
  auto c = a.matmul(b).relu();
  EXPECT_TRUE(torch::allclose(c.cpu(), a.cpu().matmul(b.cpu()).relu(), 1e-3, 1e-2));
}

TEST(TorchCudaAllocator, PoolServesLibtorchAllocationsWithALeakReport) {
  INSTALL_OR_SKIP();
  tmem::MemoryStack& stack = device0();
  EXPECT_EQ(stack.pool().options().name, "cuda:0");
  EXPECT_EQ(c10::cuda::CUDACachingAllocator::get()->name(), "tandem");
  torch::manual_seed(0);
  some_work();  // libtorch keeps a few allocations for the process (cuBLAS workspace): baseline
  torch::cuda::synchronize();
  const std::set<std::uintptr_t> baseline = live_addresses();
  const tmem::MemoryStats before = stack.stats();

  torch::Tensor kept = keep_alive_on_gpu();
  some_work();
  const tmem::MemoryStats during = stack.stats();
  EXPECT_GE(during.requests.total - before.requests.total, 4) << "libtorch's allocations did not reach the pool";
  EXPECT_EQ(during.requested_bytes.current - before.requested_bytes.current, 4000000) << "only `kept` is still live";
  EXPECT_GE(during.allocated_bytes.peak, during.allocated_bytes.current + 3 * 512 * 512 * 4);
  EXPECT_GE(during.reserved_bytes.current, during.allocated_bytes.current);

  // The snapshot shows `kept` as an allocated block whose site is the function that made it.
  const tmem::Snapshot snap = tmem::take_snapshot(stack.top());
  const auto kept_at = reinterpret_cast<std::uintptr_t>(kept.data_ptr());
  const tmem::BlockInfo* block = nullptr;
  for (const auto& seg : snap.segments)
    for (const auto& b : seg.blocks)
      if (b.address == kept_at) block = &b;
  ASSERT_NE(block, nullptr) << "kept tensor not in the snapshot";
  EXPECT_EQ(block->state, tmem::BlockState::kAllocated);
  EXPECT_EQ(block->requested, 4000000u);
  ASSERT_GE(block->site, 0);
  EXPECT_NE(snap.sites.at(static_cast<std::size_t>(block->site)).label.find("keep_alive_on_gpu"), std::string::npos);
  const std::string json = tmem::snapshot_to_json(snap);
  EXPECT_NE(json.find("\"schema\":\"tandem.memory.snapshot/1\""), std::string::npos);
  EXPECT_NE(json.find("keep_alive_on_gpu"), std::string::npos);

  // The leak report: beyond the baseline, exactly `kept`, named by its allocating function.
  torch::cuda::synchronize();
  std::vector<std::uintptr_t> extra;
  for (std::uintptr_t a : live_addresses())
    if (!baseline.count(a)) extra.push_back(a);
  ASSERT_EQ(extra.size(), 1u);
  EXPECT_EQ(extra[0], kept_at);
  const std::string report = stack.tracking()->format_live_report();
  EXPECT_NE(report.find("keep_alive_on_gpu"), std::string::npos) << report;

  // Freed: the report holds nothing of this test any more.
  kept.reset();
  EXPECT_EQ(live_addresses(), baseline);
  const std::string after = stack.tracking()->format_live_report();
  EXPECT_EQ(after.find("keep_alive_on_gpu"), std::string::npos) << after;
  EXPECT_EQ(stack.stats().requested_bytes.current, before.requested_bytes.current);
}

TEST(TorchCudaAllocator, PlantedLeakIsReportedAcrossSteps) {
  INSTALL_OR_SKIP();
  tmem::LeakDetectorOptions lo;
  std::vector<tmem::LeakReport> reports;
  lo.on_leak = [&](const tmem::LeakReport& r) { reports.push_back(r); };
  tmem::LeakDetector detector(*device0().tracking(), lo);
  std::vector<torch::Tensor> keep;
  for (int step = 0; step < 30; ++step) {
    some_work();
    planted_gpu_leak(keep);
    detector.mark_step();
  }
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].site.label.find("planted_gpu_leak"), std::string::npos) << reports[0].message;
}

TEST(TorchCudaAllocator, RecordStreamKeepsABlockFromReuseUntilTheStreamIsDone) {
  INSTALL_OR_SKIP();
  tmem::CrossStreamResource* cross = device0().cross_stream();
  ASSERT_NE(cross, nullptr);
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  auto x = torch::ones({1 << 20}, torch::kCUDA);  // 4 MiB, default stream
  void* block = x.data_ptr();
  torch::cuda::synchronize();
  torch::Tensor y;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    at::cuda::sleep(1LL << 27);  // keeps `side` busy while the host frees and reallocates
    y = x * 2;                   // reads x on `side`
    x.record_stream(side);
  }
  x.reset();  // freed while `side` still reads it
  EXPECT_EQ(cross->pending_frees(), 1u);
  // Same size, default stream: without the event, best fit would hand out `block` again.
  auto z = torch::empty({1 << 20}, torch::kCUDA);
  EXPECT_NE(z.data_ptr(), block) << "reused while another stream still reads it";
  z.fill_(-1.0f);
  side.synchronize();
  EXPECT_EQ(y.sum().item<float>(), 2.0f * (1 << 20));
  auto w = torch::empty({16}, torch::kCUDA);  // an allocation polls the pending frees
  EXPECT_EQ(cross->pending_frees(), 0u);
}

TEST(TorchCudaAllocator, LibtorchsStatisticsAndEmptyCacheAreTheStacks) {
  INSTALL_OR_SKIP();
  tmem::MemoryStack& stack = device0();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  torch::Tensor t;
  {
    c10::cuda::CUDAStreamGuard guard(side);  // a stream of its own: its segment holds only t
    t = torch::empty({256, 1024}, torch::kCUDA);
  }
  const tmem::MemoryStats ours = stack.stats();
  const auto theirs = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  EXPECT_EQ(theirs.allocated_bytes[kAll].current, ours.allocated_bytes.current);
  EXPECT_EQ(theirs.reserved_bytes[kAll].current, ours.reserved_bytes.current);
  EXPECT_EQ(theirs.requested_bytes[kAll].current, ours.requested_bytes.current);
  EXPECT_EQ(theirs.allocation[kAll].current, ours.allocations.current);
  EXPECT_EQ(theirs.segment[kAll].current, ours.segments.current);
  t.reset();
  std::size_t largest = 0;
  c10::cuda::CUDACachingAllocator::cacheInfo(0, &largest);
  EXPECT_EQ(static_cast<std::int64_t>(largest), stack.stats().largest_free_block);
  c10::cuda::CUDACachingAllocator::emptyCache();
  EXPECT_LT(stack.stats().reserved_bytes.current, ours.reserved_bytes.current);
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const auto reset = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  EXPECT_EQ(reset.allocated_bytes[kAll].peak, reset.allocated_bytes[kAll].current);
}

TEST(TorchCudaAllocator, OutOfMemoryIsLibtorchsTypeWithTandemsMessage) {
  INSTALL_OR_SKIP();
  try {
    auto huge = torch::empty({3LL << 30}, torch::kCUDA);  // 12 GiB, above the 8 GiB cap
    FAIL() << "expected c10::OutOfMemoryError";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string m = e.what();
    for (const char* part : {"out of memory in CachingPool 'cuda:0'", "requested 12.0 GiB", "limit 8.0 GiB", "What to try"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " missing in: " << m;
  }
  auto small = torch::ones({1024}, torch::kCUDA);  // still usable
  EXPECT_EQ(small.sum().item<float>(), 1024.0f);
}

TEST(TorchCudaAllocator, InstallingTwiceIsAClearError) {
  INSTALL_OR_SKIP();
  try {
    tmem::install_cuda_allocator();
    FAIL() << "expected tandem::ConfigError";
  } catch (const tandem::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("already installed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tmem::installed_cuda_stacks().size(), install_once().stacks.size());
}

// Needs a process where tandem's allocator was not installed first: ctest gives it one; a run of
// the whole executable skips it (declared last so it runs after the others there).
TEST(TorchCudaAllocator, InstallAfterLibtorchsFirstCudaAllocationIsAClearError) {
  if (!tmem::installed_cuda_stacks().empty()) GTEST_SKIP() << "tandem's allocator is installed in this process";
  std::string why;
  if (!tmem::cuda_allocator_available(&why)) GTEST_SKIP() << "tandem's CUDA allocator: " << why;
  if (!torch::cuda::is_available()) GTEST_SKIP() << "libtorch sees no CUDA device";
  auto t = torch::ones({16}, torch::kCUDA);  // libtorch's own allocator is now in use
  try {
    tmem::install_cuda_allocator();
    FAIL() << "expected tandem::ConfigError";
  } catch (const tandem::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("already initialised"), std::string::npos) << m;
    EXPECT_NE(m.find("before any CUDA work"), std::string::npos) << m;
  }
  EXPECT_TRUE(tmem::installed_cuda_stacks().empty());
  EXPECT_EQ(t.sum().item<float>(), 16.0f);  // nothing changed
}

}  // namespace
