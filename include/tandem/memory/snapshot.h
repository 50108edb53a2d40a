// Snapshot of an allocator stack: every segment and block, the allocation sites tracking knows,
// a memory-over-time timeline and the statistics. Written as JSON (format documented in
// docs/memory.md) and drawn by tools/memory_snapshot_render.py.
//
// Ownership: a Snapshot is a value that owns copies of everything it lists.
// Thread-safety: take_snapshot() may run while other threads allocate (each layer is consistent
// on its own); the JSON functions are reentrant.
// Errors: write_snapshot_json() throws tandem::Error when the file cannot be written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tandem/memory/memory_resource.h>
#include <tandem/memory/memory_stats.h>

namespace tandem::memory {

// State of one block of a segment.
enum class BlockState {
  kAllocated,    // handed to a caller
  kThreadCached, // freed, parked in one thread's private cache
  kFree,         // free in the pool, reusable by anyone
};

// "allocated", "thread_cached" or "free".
const char* to_string(BlockState state);

// One block. step/time_ns/site are filled by a TrackingResource (-1 when unknown).
struct BlockInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;       // bytes the block occupies
  std::size_t requested = 0;  // bytes the caller asked for (0 when unknown)
  BlockState state = BlockState::kFree;
  std::int64_t step = -1;     // training step at allocation
  std::int64_t time_ns = -1;  // allocation time (tracking clock)
  std::int64_t site = -1;     // index into Snapshot::sites
};

// One segment obtained from the upstream, with its blocks in address order.
struct SegmentInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  StreamId stream;
  std::string pool;  // "small", "large" or "aligned" (dedicated, over-aligned allocation)
  std::vector<BlockInfo> blocks;
};

// An allocation site: the symbolised stack (innermost first) of the allocations it stands for.
struct SiteInfo {
  std::uint64_t id = 0;
  std::string label;                // the first frame outside the allocator and libtorch
  std::vector<std::string> frames;  // symbolised frames, innermost first
};

// Live bytes at one mark_step() (from a TrackingResource).
struct TimelinePoint {
  std::int64_t step = 0;
  std::int64_t time_ns = 0;
  std::int64_t live_bytes = 0;      // live bytes seen by the tracking layer
  std::int64_t reserved_bytes = 0;  // reserved by the pool below it (0 without a pool)
};

// A whole snapshot. Build it with take_snapshot().
struct Snapshot {
  std::vector<SegmentInfo> segments;
  std::vector<SiteInfo> sites;
  std::vector<TimelinePoint> timeline;
  MemoryStats stats;
};

// Collects segments, sites, timeline and stats from `resource` and everything below it.
// Thread-safe (the result is consistent per layer).
Snapshot take_snapshot(const MemoryResource& resource);

// The snapshot as a JSON document (schema "tandem.memory.snapshot/1").
std::string snapshot_to_json(const Snapshot& snapshot);

// Writes snapshot_to_json() to `path`; throws tandem::Error if the file cannot be written.
void write_snapshot_json(const Snapshot& snapshot, const std::string& path);

}  // namespace tandem::memory
