// tandem as libtorch's CPU allocator: identical training, leak detection through libtorch,
// a clean loop that reports nothing, and out-of-memory under a cap.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <string>
#include <vector>

#include <tandem/base/errors.h>
#include <tandem/memory/cpu_allocator.h>
#include <tandem/memory/host_memory_stack.h>
#include <tandem/memory/leak_detector.h>

namespace tmem = tandem::memory;

// External linkage + noinline: the test binary is linked with -rdynamic, so these names appear
// in symbolised stacks.
__attribute__((noinline)) void planted_leak_step(std::vector<torch::Tensor>& keep) {
  keep.push_back(torch::randn({64, 64}));  // 16 KiB kept alive every step
}

namespace {

struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(64, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 64));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Trains a small MLP with SGD+momentum for `steps` steps; calls `each_step` after every step.
torch::Tensor train(int steps, const std::function<void(int)>& each_step = {}) {
  torch::manual_seed(1234);
  auto model = std::make_shared<Mlp>();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    auto x = torch::randn({16, 64});
    auto y = torch::randn({16, 64});
    opt.zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    opt.step();
    if (each_step) each_step(step);
  }
  std::vector<torch::Tensor> flat;
  for (auto& p : model->parameters()) flat.push_back(p.detach().flatten().clone());
  return torch::cat(flat);
}

tmem::HostMemoryStackOptions tracked_stack() {
  tmem::HostMemoryStackOptions o;
  o.tracking = true;
  o.tracking_options.stacks = tmem::StackCapture::kAll;
  o.tracking_options.max_frames = 64;
  o.tracking_options.report_at_exit = false;
  return o;
}

// Installs a stack for the duration of a test.
struct Installed {
  explicit Installed(tmem::HostMemoryStackOptions o) : stack(tmem::install_host_cpu_allocator(std::move(o), 50)) {}
  ~Installed() { tmem::uninstall_cpu_allocator(); }
  std::shared_ptr<tmem::HostMemoryStack> stack;
};

TEST(TorchAllocator, TrainingGivesIdenticalResults) {
  at::set_num_threads(1);
  const torch::Tensor reference = train(50);
  torch::Tensor with_tandem;
  {
    Installed inst{tmem::HostMemoryStackOptions{}};
    ASSERT_NE(inst.stack, nullptr);
    ASSERT_EQ(tmem::installed_cpu_resource(), &inst.stack->top());
    with_tandem = train(50);
    const auto s = inst.stack->stats();
    EXPECT_GT(s.requests.total, 1000) << "tensors did not go through tandem";
    EXPECT_GT(s.cache_hit_rate(), 0.9);
  }
  EXPECT_EQ(tmem::installed_cpu_resource(), nullptr);
  EXPECT_TRUE(torch::equal(reference, with_tandem));
}

// Kernels that allocate through c10's raw_allocate()/raw_deallocate() (GELU's backward did, with a
// zero-size scratch) need a raw deleter: before it existed they aborted on an internal assert.
TEST(TorchAllocator, RawAllocationsWorkAndKernelsUsingThemRun) {
  Installed inst{tmem::HostMemoryStackOptions{}};
  c10::Allocator* cpu = c10::GetCPUAllocator();
  ASSERT_NE(cpu->raw_deleter(), nullptr);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4096}}) {
    void* p = cpu->raw_allocate(n);
    if (n > 0) std::memset(p, 0xab, n);
    cpu->raw_deallocate(p);
  }
  auto x = torch::randn({32, 16}, torch::requires_grad());
  torch::gelu(x).sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>());
}

TEST(TorchAllocator, PlantedLeakIsReportedWithin30Steps) {
  Installed inst{tracked_stack()};
  ASSERT_NE(inst.stack, nullptr);
  tmem::LeakDetectorOptions lo;
  lo.window = 20;
  std::vector<tmem::LeakReport> reports;
  lo.on_leak = [&](const tmem::LeakReport& r) { reports.push_back(r); };
  tmem::LeakDetector detector(*inst.stack->tracking(), lo);
  std::vector<torch::Tensor> keep;
  int found_at = -1;
  train(30, [&](int step) {
    planted_leak_step(keep);
    if (!detector.mark_step().empty() && found_at < 0) found_at = step + 1;
  });
  ASSERT_FALSE(reports.empty()) << "leak not reported in 30 steps";
  EXPECT_LE(found_at, 30);
  ASSERT_EQ(reports.size(), 1u) << reports[0].message << (reports.size() > 1 ? reports[1].message : "");
  std::string frames;
  for (const auto& f : reports[0].site.frames) frames += f + "\n";
  EXPECT_NE(frames.find("planted_leak_step"), std::string::npos) << reports[0].message;
  EXPECT_NE(reports[0].site.label.find("planted_leak_step"), std::string::npos) << reports[0].message;
  EXPECT_NE(reports[0].message.find("per step for 20 steps"), std::string::npos) << reports[0].message;
  keep.clear();
}

TEST(TorchAllocator, Clean200StepLoopReportsNothing) {
  Installed inst{tracked_stack()};
  ASSERT_NE(inst.stack, nullptr);
  tmem::LeakDetectorOptions lo;
  std::vector<std::string> reports;
  lo.on_leak = [&](const tmem::LeakReport& r) { reports.push_back(r.message); };
  tmem::LeakDetector detector(*inst.stack->tracking(), lo);
  train(200, [&](int) { detector.mark_step(); });
  EXPECT_TRUE(reports.empty()) << reports.front();
}

TEST(TorchAllocator, OutOfMemoryUnderCapGivesDocumentedMessage) {
  tmem::HostMemoryStackOptions o;
  o.limit_bytes = 64 << 20;
  Installed inst{o};
  ASSERT_NE(inst.stack, nullptr);
  auto small = torch::ones({1024, 1024});  // 4 MiB: fine
  try {
    auto huge = torch::empty({100 << 20});  // 400 MiB: over the cap
    FAIL() << "expected tandem::OutOfMemoryError";
  } catch (const tandem::OutOfMemoryError& e) {
    const std::string m = e.what();
    for (const char* part : {"out of memory", "requested 400.0 MiB", "allocated 4.0 MiB", "reserved",
                             "limit 64.0 MiB", "largest free block", "fragmentation", "What to try"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " missing in: " << m;
  }
  EXPECT_EQ(small.sum().item<float>(), 1024.0f * 1024.0f);
}

}  // namespace
