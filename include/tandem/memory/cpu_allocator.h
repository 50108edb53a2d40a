// libtorch integration: route every CPU tensor allocation through a tandem MemoryResource.
// This header includes no torch headers; the adapter lives in the tandem library.
//
// Ownership: an installed resource is kept alive for the rest of the process (tensors may outlive
// any owner); install_host_cpu_allocator() shares its stack with the caller.
// Thread-safety: every function may be called from any thread.
// Errors: allocations through libtorch throw what the resource throws (OutOfMemoryError);
// install_host_cpu_allocator() throws ConfigError for invalid options; the other functions report
// failure through their return value.
#pragma once

#include <cstdint>
#include <memory>

#include <tandem/memory/host_memory_stack.h>
#include <tandem/memory/memory_resource.h>

namespace tandem::memory {

// Installs `resource` as libtorch's CPU allocator with c10::SetCPUAllocator(…, priority); an
// allocator already installed with a higher priority stays (and this returns false).
// Tensors allocated before keep their old deleter; tensors allocated after free into `resource`
// wherever they die. The resource is kept alive for the rest of the process (tensors may outlive
// any owner), so installing is cheap to get right and costs one stack per install.
// Each tensor carries a 64-byte header (size and resource) in front of its data; data stays
// 64-byte aligned as libtorch expects. Thread-safe.
bool install_cpu_allocator(std::shared_ptr<MemoryResource> resource, std::uint8_t priority = 1);

// Builds a HostMemoryStack from `options`, installs it, and returns it (to read stats, take
// snapshots or drive a LeakDetector). If options.tracking_options.report_at_exit is set, the live
// allocations are reported when the process exits. Thread-safe.
std::shared_ptr<HostMemoryStack> install_host_cpu_allocator(HostMemoryStackOptions options = {},
                                                            std::uint8_t priority = 1);

// Puts back the CPU allocator that was active before the most recent successful install
// (libtorch's default after a single install). Returns false if nothing was installed.
// Thread-safe.
bool uninstall_cpu_allocator();

// The resource libtorch's CPU allocator currently routes to, or nullptr if it is not tandem's.
MemoryResource* installed_cpu_resource();

// Records the installed resource's allocated/reserved bytes as the timeline counter "allocator"
// when a trace session records allocator events (trace.allocator_events); at most once per
// `min_interval_us` across threads. Cheap (one relaxed load) otherwise. Thread-safe.
void sample_allocator_counter(std::int64_t min_interval_us = 1000);

}  // namespace tandem::memory
