// The memory-resource interface every tandem allocator layer implements.
//
// Shape (after RMM): a public, non-virtual allocate()/deallocate() pair over private virtual
// hooks, so layers compose by wrapping one upstream resource:
//   TrackingResource(StatisticsResource(CachingPool(HostBackend)))
// The public functions validate arguments once; layers only implement policy.
//
// Ownership: a layer refers to its upstream, never owns it (HostMemoryStack owns a whole stack);
// allocations belong to the caller until deallocated.
// Thread-safety: see "Thread-safety" on MemoryResource below.
// Errors: allocate() throws OutOfMemoryError when memory cannot be had and ConfigError for an
// unsupported alignment; deallocate() never throws.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::memory {

struct MemoryStats;
struct Snapshot;

// Alignment a resource guarantees when the caller does not ask for more. 64 bytes is what
// libtorch's CPU allocator promises (one cache line, enough for AVX-512 loads).
inline constexpr std::size_t kDefaultAlignment = 64;

// What max_alignment() reports for a resource that honours any power-of-two alignment (the
// largest power of two a std::size_t holds).
inline constexpr std::size_t kAnyAlignment = ~(~std::size_t{0} >> 1);

// Opaque stream handle. Host resources ignore it; device resources reuse a freed block only for
// allocations on the stream it was freed on (work queued on that stream is ordered after the
// free). Value 0 is the default stream. A cudaStream_t converts with reinterpret_cast.
struct StreamId {
  std::uintptr_t value = 0;
  friend bool operator==(StreamId a, StreamId b) { return a.value == b.value; }
  friend bool operator!=(StreamId a, StreamId b) { return a.value != b.value; }
  friend bool operator<(StreamId a, StreamId b) { return a.value < b.value; }
};

// Base class of every allocator layer.
//
// Contract: allocate(n, a, s) returns memory of at least n bytes aligned to a (a power of two;
// 0 means kDefaultAlignment), or throws tandem::OutOfMemoryError; allocate(0) returns nullptr.
// deallocate(p, n, a, s) must be given exactly the n, a and s passed to the allocate() that
// returned p; deallocate(nullptr, ...) does nothing. Alignments above what a layer supports
// throw tandem::ConfigError.
//
// Thread-safety: every resource shipped with tandem is safe to call from many threads at once;
// a layer is as thread-safe as its upstream, so custom layers must be too.
// Lifetime: a resource must outlive every allocation it returned and every layer built on it.
class MemoryResource {
 public:
  MemoryResource() = default;
  MemoryResource(const MemoryResource&) = delete;
  MemoryResource& operator=(const MemoryResource&) = delete;
  virtual ~MemoryResource() = default;

  // Allocates `bytes` aligned to `alignment` for use on `stream`. Thread-safe.
  void* allocate(std::size_t bytes, std::size_t alignment = kDefaultAlignment, StreamId stream = {});

  // Returns memory obtained from allocate() with the same bytes/alignment/stream. Thread-safe.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = kDefaultAlignment,
                  StreamId stream = {}) noexcept;

  // The largest alignment allocate() honours (a power of two; kAnyAlignment: any). A CachingPool
  // asks its upstream for segments aligned to at most this, so it works over backends with a
  // small guarantee (cudaMalloc: 256 bytes). Adaptors report their upstream's. Thread-safe,
  // never throws.
  std::size_t max_alignment() const noexcept { return do_max_alignment(); }

  // Gives cached, unused memory back to the layer below (ultimately the OS or the driver).
  // Returns the number of bytes released. Layers without a cache forward to their upstream.
  // Thread-safe; allocations in flight are unaffected.
  std::size_t release_cached() { return do_release_cached(); }

  // Adds this layer's counters to `stats` after its upstream's (see memory_stats.h for which
  // layer fills which field). Thread-safe; the figures are a consistent-enough view, not an
  // atomic snapshot across layers.
  void collect_stats(MemoryStats& stats) const { do_collect_stats(stats); }

  // Adds this layer's view of memory to `snapshot`: a pool lists segments and blocks, a tracking
  // layer annotates blocks with step/time/stack. Thread-safe.
  void collect_snapshot(Snapshot& snapshot) const { do_collect_snapshot(snapshot); }

 private:
  virtual void* do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) = 0;
  virtual void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                             StreamId stream) noexcept = 0;
  virtual std::size_t do_release_cached() { return 0; }
  virtual void do_collect_stats(MemoryStats&) const {}
  virtual void do_collect_snapshot(Snapshot&) const {}
  virtual std::size_t do_max_alignment() const noexcept { return kAnyAlignment; }
};

// Base for layers that wrap one upstream resource and forward what they do not handle.
// The upstream is referenced, not owned; it must outlive the adaptor.
class AdaptorResource : public MemoryResource {
 public:
  explicit AdaptorResource(MemoryResource& upstream) : upstream_(&upstream) {}

  // The wrapped resource.
  MemoryResource& upstream() const { return *upstream_; }

 private:
  std::size_t do_release_cached() override { return upstream_->release_cached(); }
  void do_collect_stats(MemoryStats& s) const override { upstream_->collect_stats(s); }
  void do_collect_snapshot(Snapshot& s) const override { upstream_->collect_snapshot(s); }
  std::size_t do_max_alignment() const noexcept override { return upstream_->max_alignment(); }

  MemoryResource* upstream_;
};

// Rounds `n` up to a multiple of `alignment` (a power of two).
constexpr std::size_t align_up(std::size_t n, std::size_t alignment) {
  return (n + alignment - 1) & ~(alignment - 1);
}

// True when `n` is a power of two.
constexpr bool is_pow2(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }

}  // namespace tandem::memory
