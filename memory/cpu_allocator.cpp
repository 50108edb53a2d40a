// The c10::Allocator adapter that makes a tandem MemoryResource libtorch's CPU allocator.
#include <tandem/memory/cpu_allocator.h>

#include <tandem/base/trace.h>
#include <tandem/memory/memory_stats.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace tandem::memory {
namespace {

// In front of every tensor's data: who to give it back to, and how much was taken.
struct alignas(64) Header {
  MemoryResource* resource;
  std::size_t bytes;
};
constexpr std::size_t kHeader = sizeof(Header);
constexpr std::size_t kAlign = 64;  // c10::gAlignment
static_assert(kHeader == 64, "header must keep data 64-byte aligned");

// The context is the data pointer itself (c10's raw_allocate()/raw_deallocate() require it);
// the header sits just before it.
void free_tensor_memory(void* data) {
  if (data == nullptr) return;
  void* base = static_cast<char*>(data) - kHeader;
  auto* h = static_cast<Header*>(base);
  h->resource->deallocate(base, h->bytes, kAlign);
}

class TandemCpuAllocator final : public c10::Allocator {
 public:
  explicit TandemCpuAllocator(std::shared_ptr<MemoryResource> r) : resource_(std::move(r)) {}

  c10::DataPtr allocate(std::size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &free_tensor_memory, cpu};
    const std::size_t total = n + kHeader;
    void* base = resource_->allocate(total, kAlign);
    auto* h = static_cast<Header*>(base);
    h->resource = resource_.get();
    h->bytes = total;
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &free_tensor_memory, cpu};
  }

  // Every DataPtr carries this deleter with context == data, so kernels that allocate raw
  // (GELU's scratch, for one) may free by data pointer alone.
  c10::DeleterFnPtr raw_deleter() const override { return &free_tensor_memory; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  MemoryResource* resource() const { return resource_.get(); }

 private:
  std::shared_ptr<MemoryResource> resource_;
};

// Installed adapters and what they replaced. Never destroyed: tensors freed during static
// destruction must still find their resource.
struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<TandemCpuAllocator>> adapters;  // every adapter ever installed
  std::vector<std::pair<c10::Allocator*, std::uint8_t>> previous;  // stack of (replaced, priority)
  std::vector<std::shared_ptr<HostMemoryStack>> report_at_exit;
};

Registry& registry() {
  static Registry* r = new Registry;  // immortal on purpose, see above
  return *r;
}

void report_live_at_exit() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& s : r.report_at_exit) {
    TrackingResource* t = s->tracking();
    if (t == nullptr || t->live_bytes() == 0) continue;
    const std::string report = t->format_live_report();
    if (t->options().sink) t->options().sink(report);
    else std::fputs(report.c_str(), stderr);
  }
}

}  // namespace

bool install_cpu_allocator(std::shared_ptr<MemoryResource> resource, std::uint8_t priority) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  c10::Allocator* before = c10::GetCPUAllocator();
  auto adapter = std::make_unique<TandemCpuAllocator>(std::move(resource));
  c10::SetCPUAllocator(adapter.get(), priority);
  if (c10::GetCPUAllocator() != adapter.get()) return false;  // a higher priority one stays
  r.previous.emplace_back(before, priority);
  r.adapters.push_back(std::move(adapter));
  return true;
}

std::shared_ptr<HostMemoryStack> install_host_cpu_allocator(HostMemoryStackOptions options, std::uint8_t priority) {
  const bool report = options.tracking && options.tracking_options.report_at_exit;
  auto stack = std::make_shared<HostMemoryStack>(std::move(options));
  if (stack->tracking() != nullptr) stack->tracking()->set_report_at_exit(false);  // reported below instead
  std::shared_ptr<MemoryResource> top(stack, &stack->top());
  if (!install_cpu_allocator(top, priority)) return nullptr;
  if (report) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.report_at_exit.empty()) std::atexit(report_live_at_exit);
    r.report_at_exit.push_back(stack);
  }
  return stack;
}

bool uninstall_cpu_allocator() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.previous.empty()) return false;
  auto [before, priority] = r.previous.back();
  r.previous.pop_back();
  c10::SetCPUAllocator(before, priority);
  return true;
}

MemoryResource* installed_cpu_resource() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  c10::Allocator* now = c10::GetCPUAllocator();
  for (auto& a : r.adapters)
    if (a.get() == now) return a->resource();
  return nullptr;
}

void sample_allocator_counter(std::int64_t min_interval_us) {
  static std::atomic<std::int64_t> last_sample{0};
  if (!trace::allocator_events()) return;
  const std::int64_t now = trace::now_us();
  std::int64_t last = last_sample.load(std::memory_order_relaxed);
  if (now - last < min_interval_us) return;
  if (!last_sample.compare_exchange_strong(last, now)) return;  // another thread samples
  MemoryResource* resource = installed_cpu_resource();
  if (resource == nullptr) return;
  MemoryStats s;
  resource->collect_stats(s);
  trace::counter("allocator", trace::Args()
                                  .add("allocated_bytes", s.allocated_bytes.current)
                                  .add("reserved_bytes", s.reserved_bytes.current));
}

}  // namespace tandem::memory
