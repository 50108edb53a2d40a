// install_cuda_allocator() and friends (include/tandem/memory/cuda_allocator.h): libtandem side.
// The work needs libtorch_cuda and the CUDA runtime, so it lives in libtandem_cuda.so
// (memory/torch_cuda_allocator.cpp), reached through dlopen on first use: libtandem.so itself
// names no CUDA library and loads on a machine without one.
#include <tandem/memory/cuda_allocator.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <tandem/base/errors.h>

#include "base/companion_library.h"

namespace tandem::memory {
namespace {

// Never destroyed: the stacks serve tensors until the very end of the process.
struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<MemoryStack>> stacks;
  bool report_at_exit = false;
};

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

void report_live_at_exit() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (std::size_t d = 0; d < r.stacks.size(); ++d) {
    TrackingResource* t = r.stacks[d]->tracking();
    if (t == nullptr || t->live_bytes() == 0) continue;
    const std::string report = "tandem: cuda:" + std::to_string(d) + ": " + t->format_live_report();
    if (t->options().sink) t->options().sink(report);
    else std::fputs(report.c_str(), stderr);
  }
}

}  // namespace

bool cuda_allocator_available(std::string* why) {
  std::string reason;
  using Fn = int (*)();
  auto count = reinterpret_cast<Fn>(tandem::cuda_companion_symbol("tandem_cuda_memory_device_count", &reason));
  if (count != nullptr && count() > 0) return true;
  if (count != nullptr) reason = "the CUDA runtime sees no device (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them)";
  if (why != nullptr) *why = reason;
  return false;
}

std::vector<std::shared_ptr<MemoryStack>> install_cuda_allocator(MemoryStackOptions options) {
  using Fn = void (*)(const MemoryStackOptions&, std::vector<std::shared_ptr<MemoryStack>>&);
  std::string why;
  auto install = reinterpret_cast<Fn>(tandem::cuda_companion_symbol("tandem_cuda_install_allocator", &why));
  if (install == nullptr)
    throw ConfigError("tandem: install_cuda_allocator: " + why + "; without it libtorch keeps its own CUDA allocator.");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const bool report = options.tracking && options.tracking_options.report_at_exit;
  options.tracking_options.report_at_exit = false;  // the stacks are never destroyed: reported below
  std::vector<std::shared_ptr<MemoryStack>> stacks;
  install(options, stacks);  // throws ConfigError, having changed nothing
  r.stacks = stacks;
  if (report && !r.report_at_exit) {
    r.report_at_exit = true;
    std::atexit(report_live_at_exit);
  }
  return stacks;
}

std::vector<std::shared_ptr<MemoryStack>> installed_cuda_stacks() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.stacks;
}

}  // namespace tandem::memory
