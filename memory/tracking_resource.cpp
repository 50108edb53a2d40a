// TrackingResource: sharded per-allocation records and an allocation-site table.
#include <tandem/memory/tracking_resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <unordered_set>

#include <tandem/memory/memory_stats.h>
#include <tandem/memory/stack_trace.h>

namespace tandem::memory {

struct TrackingResource::Site {
  std::uint64_t id = 0;
  std::vector<void*> frames;
  std::atomic<std::int64_t> live_bytes{0}, live_count{0};
};

namespace {
thread_local std::uint32_t t_sample_counter = 0;
}  // namespace

std::vector<std::string> TrackingOptions::default_prefixes() { return default_internal_prefixes(); }

TrackingResource::TrackingResource(MemoryResource& upstream, TrackingOptions options)
    : AdaptorResource(upstream), options_(std::move(options)), shards_(new Shard[kShards]) {
  auto site = std::make_unique<Site>();
  no_stack_site_ = site.get();
  sites_.emplace(0, std::move(site));
  report_at_exit_.store(options_.report_at_exit);
  if (options_.sample_every == 0) options_.sample_every = 1;
}

TrackingResource::~TrackingResource() {
  if (report_at_exit_.load() && live_bytes_.load() > 0) {
    const std::string report = format_live_report();
    if (options_.sink) options_.sink(report);
    else std::fputs(report.c_str(), stderr);
  }
}

std::int64_t TrackingResource::now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TrackingResource::Shard& TrackingResource::shard_for(const void* p) const {
  auto v = reinterpret_cast<std::uintptr_t>(p);
  v ^= v >> 17;
  v *= 0x9e3779b97f4a7c15ull;
  return shards_[(v >> 58) % kShards];
}

TrackingResource::Site* TrackingResource::site_for_current_stack() {
  constexpr std::size_t kMaxFrames = 256;
  void* frames[kMaxFrames];
  const std::size_t n = capture_stack(frames, std::min(options_.max_frames, kMaxFrames), 2);
  if (n == 0) return no_stack_site_;
  const std::uint64_t h = hash_stack(frames, n);
  std::lock_guard<std::mutex> lock(sites_mu_);
  auto& slot = sites_[h];
  if (!slot) {
    slot = std::make_unique<Site>();
    slot->id = h;
    slot->frames.assign(frames, frames + n);
  }
  return slot.get();
}

void* TrackingResource::do_allocate(std::size_t bytes, std::size_t alignment, StreamId stream) {
  void* p = upstream().allocate(bytes, alignment, stream);
  Site* site = no_stack_site_;
  if (options_.stacks == StackCapture::kAll ||
      (options_.stacks == StackCapture::kSampled && ++t_sample_counter % options_.sample_every == 0)) {
    try {
      site = site_for_current_stack();
    } catch (...) {  // bad_alloc of the site table: keep the allocation, lose the stack
      site = no_stack_site_;
    }
  }
  Record r{bytes, step_.load(std::memory_order_relaxed), now(), site};
  Shard& shard = shard_for(p);
  try {
    std::lock_guard<std::mutex> lock(shard.mu);
    shard.records.emplace(p, r);
  } catch (...) {
    upstream().deallocate(p, bytes, alignment, stream);
    throw;
  }
  site->live_bytes.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  site->live_count.fetch_add(1, std::memory_order_relaxed);
  live_bytes_.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  return p;
}

void TrackingResource::do_deallocate(void* p, std::size_t bytes, std::size_t alignment, StreamId stream) noexcept {
  Shard& shard = shard_for(p);
  Site* site = nullptr;
  std::size_t size = bytes;
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.records.find(p);
    if (it != shard.records.end()) {
      site = it->second.site;
      size = it->second.size;
      shard.records.erase(it);
    }
  }
  if (site != nullptr) {
    site->live_bytes.fetch_sub(static_cast<std::int64_t>(size), std::memory_order_relaxed);
    site->live_count.fetch_sub(1, std::memory_order_relaxed);
    live_bytes_.fetch_sub(static_cast<std::int64_t>(size), std::memory_order_relaxed);
  }
  upstream().deallocate(p, bytes, alignment, stream);
}

std::int64_t TrackingResource::mark_step() {
  MemoryStats s;
  upstream().collect_stats(s);
  const std::int64_t step = step_.fetch_add(1) + 1;
  TimelinePoint pt{step, now(), live_bytes_.load(), s.reserved_bytes.current};
  std::lock_guard<std::mutex> lock(timeline_mu_);
  if (timeline_.size() >= options_.timeline_capacity && !timeline_.empty()) {
    // Keep every other point of the older half: a long run still fits, at lower resolution.
    std::vector<TimelinePoint> thinned;
    for (std::size_t i = 0; i < timeline_.size(); ++i)
      if (i >= timeline_.size() / 2 || i % 2 == 0) thinned.push_back(timeline_[i]);
    timeline_.swap(thinned);
  }
  timeline_.push_back(pt);
  return step;
}

std::vector<AllocationRecord> TrackingResource::live_allocations() const {
  std::vector<AllocationRecord> out;
  for (std::size_t i = 0; i < kShards; ++i) {
    std::lock_guard<std::mutex> lock(shards_[i].mu);
    for (const auto& [p, r] : shards_[i].records)
      out.push_back({reinterpret_cast<std::uintptr_t>(p), r.size, r.step, r.time_ns, r.site->id});
  }
  return out;
}

std::vector<SiteLive> TrackingResource::live_by_site_fast() const {
  std::vector<SiteLive> out;
  std::lock_guard<std::mutex> lock(sites_mu_);
  out.reserve(sites_.size());
  for (const auto& [id, s] : sites_)
    out.push_back({id, s->live_bytes.load(std::memory_order_relaxed), s->live_count.load(std::memory_order_relaxed)});
  return out;
}

SiteInfo TrackingResource::site_info(std::uint64_t id) const {
  SiteInfo info;
  info.id = id;
  std::vector<void*> frames;
  {
    std::lock_guard<std::mutex> lock(sites_mu_);
    auto it = sites_.find(id);
    if (it != sites_.end()) frames = it->second->frames;
  }
  if (frames.empty()) {
    info.label = id == 0 ? "<no stack captured>" : "<unknown site>";
    return info;
  }
  for (void* f : frames) info.frames.push_back(symbolize(f));
  for (const auto& f : info.frames) {
    if (!is_internal_frame(f, options_.internal_prefixes)) {
      info.label = f;
      break;
    }
  }
  if (info.label.empty()) info.label = info.frames.front();
  return info;
}

std::vector<SiteSummary> TrackingResource::live_by_site() const {
  std::unordered_map<std::uint64_t, SiteSummary> by;
  for (const auto& r : live_allocations()) {
    auto& s = by[r.site];
    if (s.live_count == 0 || r.step < s.oldest_step) s.oldest_step = r.step;
    s.live_bytes += static_cast<std::int64_t>(r.size);
    s.live_count += 1;
  }
  std::vector<SiteSummary> out;
  for (auto& [id, s] : by) {
    s.site = site_info(id);
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const SiteSummary& a, const SiteSummary& b) { return a.live_bytes > b.live_bytes; });
  return out;
}

std::string TrackingResource::format_live_report(std::size_t max_sites) const {
  const auto sites = live_by_site();
  std::int64_t total = 0, count = 0;
  for (const auto& s : sites) {
    total += s.live_bytes;
    count += s.live_count;
  }
  std::ostringstream o;
  o << "tandem: " << count << " live allocations (" << format_bytes(total) << ") from " << sites.size()
    << " allocation sites:\n";
  std::size_t shown = 0;
  for (const auto& s : sites) {
    if (shown++ == max_sites) {
      o << "  ... " << sites.size() - max_sites << " more sites\n";
      break;
    }
    o << "  " << format_bytes(s.live_bytes) << " in " << s.live_count << " allocations (oldest from step "
      << s.oldest_step << ") at " << s.site.label << "\n";
    for (const auto& f : s.site.frames) o << "      " << f << "\n";
  }
  if (options_.stacks == StackCapture::kNone)
    o << "  (stacks not captured: set TrackingOptions::stacks to see where they were allocated)\n";
  return o.str();
}

void TrackingResource::do_collect_snapshot(Snapshot& snap) const {
  upstream().collect_snapshot(snap);
  const auto records = live_allocations();
  std::unordered_map<std::uintptr_t, const AllocationRecord*> by_addr;
  for (const auto& r : records) by_addr.emplace(r.address, &r);
  std::unordered_map<std::uint64_t, std::int64_t> site_index;
  for (std::size_t i = 0; i < snap.sites.size(); ++i) site_index.emplace(snap.sites[i].id, static_cast<std::int64_t>(i));
  auto index_of = [&](std::uint64_t id) {
    auto it = site_index.find(id);
    if (it != site_index.end()) return it->second;
    snap.sites.push_back(site_info(id));
    const auto idx = static_cast<std::int64_t>(snap.sites.size() - 1);
    site_index.emplace(id, idx);
    return idx;
  };
  std::unordered_set<std::uintptr_t> seen;
  for (auto& seg : snap.segments) {
    for (auto& b : seg.blocks) {
      if (b.state != BlockState::kAllocated) continue;
      auto it = by_addr.find(b.address);
      if (it == by_addr.end()) continue;
      b.step = it->second->step;
      b.time_ns = it->second->time_ns;
      b.requested = it->second->size;
      b.site = index_of(it->second->site);
      seen.insert(b.address);
    }
  }
  // Allocations no pool below us knows about (no CachingPool in the stack): one segment each.
  for (const auto& r : records) {
    if (seen.count(r.address)) continue;
    SegmentInfo seg;
    seg.address = r.address;
    seg.size = r.size;
    seg.pool = "upstream";
    BlockInfo b;
    b.address = r.address;
    b.size = r.size;
    b.requested = r.size;
    b.state = BlockState::kAllocated;
    b.step = r.step;
    b.time_ns = r.time_ns;
    b.site = index_of(r.site);
    seg.blocks.push_back(b);
    snap.segments.push_back(std::move(seg));
  }
  std::lock_guard<std::mutex> lock(timeline_mu_);
  snap.timeline.insert(snap.timeline.end(), timeline_.begin(), timeline_.end());
}

}  // namespace tandem::memory
