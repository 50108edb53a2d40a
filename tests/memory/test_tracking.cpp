// TrackingResource, stack capture, the leak detector and snapshots (no torch).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <tandem/memory/caching_pool.h>
#include <tandem/memory/host_backend.h>
#include <tandem/memory/host_memory_stack.h>
#include <tandem/memory/leak_detector.h>
#include <tandem/memory/snapshot.h>
#include <tandem/memory/stack_trace.h>
#include <tandem/memory/tracking_resource.h>

namespace tmem = tandem::memory;

// Functions with external linkage and no inlining, so the test binary (linked with -rdynamic)
// can name them in stacks.
extern "C++" {
__attribute__((noinline)) void* tandem_test_leaky_site(tmem::MemoryResource& r, std::size_t n) {
  void* p = r.allocate(n);
  asm volatile("" ::: "memory");
  return p;
}
__attribute__((noinline)) std::size_t tandem_test_capture(void** frames, std::size_t n) {
  const std::size_t got = tmem::capture_stack(frames, n, 0);
  asm volatile("" ::: "memory");
  return got;
}
__attribute__((noinline)) void* tandem_test_steady_site(tmem::MemoryResource& r, std::size_t n) {
  void* p = r.allocate(n);
  asm volatile("" ::: "memory");
  return p;
}
}

namespace {

tmem::TrackingOptions all_stacks() {
  tmem::TrackingOptions o;
  o.stacks = tmem::StackCapture::kAll;
  o.report_at_exit = false;
  return o;
}

TEST(StackTrace, CapturesAndSymbolisesCaller) {
  void* frames[32];
  const std::size_t n = tandem_test_capture(frames, 32);
  ASSERT_GT(n, 2u);
  std::string all;
  for (std::size_t i = 0; i < n; ++i) all += tmem::symbolize(frames[i]) + "\n";
  EXPECT_NE(all.find("tandem_test_capture"), std::string::npos) << all;
  EXPECT_TRUE(tmem::is_internal_frame("at::Tensor c10::Dispatcher::call(int) (libtorch_cpu.so+0x12)",
                                    tmem::default_internal_prefixes()));
  EXPECT_TRUE(tmem::is_internal_frame("libc10.so+0x1234", tmem::default_internal_prefixes()));
  EXPECT_FALSE(tmem::is_internal_frame("train_step(Net&) (train+0x40)", tmem::default_internal_prefixes()));
}

TEST(Tracking, RecordsSizeStepAndSite) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  tmem::TrackingResource track(pool, all_stacks());
  void* a = tandem_test_leaky_site(track, 1000);
  track.mark_step();
  void* b = tandem_test_steady_site(track, 3000);
  auto recs = track.live_allocations();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(track.live_bytes(), 4000);
  auto sites = track.live_by_site();
  ASSERT_EQ(sites.size(), 2u);
  EXPECT_EQ(sites[0].live_bytes, 3000);
  EXPECT_EQ(sites[0].oldest_step, 1);
  EXPECT_NE(sites[0].site.label.find("tandem_test_steady_site"), std::string::npos) << sites[0].site.label;
  EXPECT_NE(sites[1].site.label.find("tandem_test_leaky_site"), std::string::npos) << sites[1].site.label;
  const std::string report = track.format_live_report();
  EXPECT_NE(report.find("2 live allocations"), std::string::npos) << report;
  track.deallocate(a, 1000);
  track.deallocate(b, 3000);
  EXPECT_EQ(track.live_bytes(), 0);
}

TEST(Tracking, ShutdownReportGroupsBySite) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  std::string out;
  std::vector<void*> kept;
  {
    auto o = all_stacks();
    o.report_at_exit = true;
    o.sink = [&](const std::string& s) { out = s; };
    tmem::TrackingResource track(pool, o);
    for (int i = 0; i < 3; ++i) kept.push_back(tandem_test_leaky_site(track, 100));
  }
  EXPECT_NE(out.find("3 live allocations"), std::string::npos) << out;
  EXPECT_NE(out.find("tandem_test_leaky_site"), std::string::npos) << out;
  for (void* p : kept) pool.deallocate(p, 100);
}

TEST(LeakDetector, FindsSteadyGrowthAndIgnoresSteadyState) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  tmem::TrackingResource track(pool, all_stacks());
  std::vector<tmem::LeakReport> seen;
  tmem::LeakDetectorOptions lo;
  lo.on_leak = [&](const tmem::LeakReport& r) { seen.push_back(r); };
  tmem::LeakDetector detector(track, lo);
  std::vector<void*> leaked;
  void* state = tandem_test_steady_site(track, 1 << 20);  // allocated once, kept: not a leak
  int found_at = -1;
  for (int step = 1; step <= 40; ++step) {
    // Reused every step: allocated and freed within the step.
    std::vector<void*> tmp;
    for (int i = 0; i < 10; ++i) tmp.push_back(tandem_test_steady_site(track, 4096 * (1 + i)));
    leaked.push_back(tandem_test_leaky_site(track, 64 << 10));  // the leak
    for (int i = 0; i < 10; ++i) track.deallocate(tmp[static_cast<std::size_t>(i)], 4096 * (1 + i));
    if (!detector.mark_step().empty() && found_at < 0) found_at = step;
  }
  ASSERT_EQ(seen.size(), 1u) << "only the leaking site may be reported";
  EXPECT_LE(found_at, 30);
  EXPECT_NE(seen[0].site.label.find("tandem_test_leaky_site"), std::string::npos) << seen[0].message;
  EXPECT_EQ(seen[0].bytes_per_step, 64 << 10);
  EXPECT_NE(seen[0].message.find("gained 64.0 KiB per step for 20 steps"), std::string::npos) << seen[0].message;
  for (void* p : leaked) track.deallocate(p, 64 << 10);
  track.deallocate(state, 1 << 20);
}

TEST(LeakDetector, WithoutStacksStillSeesGrowth) {
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  tmem::TrackingOptions o;
  o.report_at_exit = false;
  tmem::TrackingResource track(pool, o);
  tmem::LeakDetectorOptions lo;
  lo.on_leak = [](const tmem::LeakReport&) {};
  tmem::LeakDetector detector(track, lo);
  std::vector<void*> leaked;
  for (int step = 0; step < 25; ++step) {
    leaked.push_back(track.allocate(8192));
    detector.mark_step();
  }
  ASSERT_EQ(detector.reports().size(), 1u);
  EXPECT_NE(detector.reports()[0].message.find("stacks are not captured"), std::string::npos);
  for (void* p : leaked) track.deallocate(p, 8192);
}

TEST(Snapshot, JsonHasSegmentsBlocksSitesAndTimeline) {
  tmem::HostMemoryStackOptions so;
  so.tracking = true;
  so.tracking_options = all_stacks();
  std::int64_t fake_now = 0;
  so.tracking_options.clock = [&] { return fake_now += 1000; };
  tmem::HostMemoryStack stack(so);
  void* a = tandem_test_leaky_site(stack.top(), 5000);
  stack.tracking()->mark_step();
  void* b = stack.top().allocate(3 << 20);
  stack.tracking()->mark_step();
  const auto snap = tmem::take_snapshot(stack.top());
  ASSERT_EQ(snap.segments.size(), 2u);
  ASSERT_EQ(snap.timeline.size(), 2u);
  EXPECT_EQ(snap.timeline[1].live_bytes, 5000 + (3 << 20));
  EXPECT_EQ(snap.timeline[1].reserved_bytes, (2 << 20) + (20 << 20));
  const tmem::BlockInfo* found = nullptr;
  for (const auto& seg : snap.segments)
    for (const auto& b2 : seg.blocks)
      if (b2.address == reinterpret_cast<std::uintptr_t>(a)) found = &b2;
  ASSERT_NE(found, nullptr);
  const auto& blk = *found;
  EXPECT_EQ(blk.state, tmem::BlockState::kAllocated);
  EXPECT_EQ(blk.requested, 5000u);
  EXPECT_EQ(blk.step, 0);
  ASSERT_GE(blk.site, 0);
  EXPECT_NE(snap.sites[static_cast<std::size_t>(blk.site)].label.find("tandem_test_leaky_site"), std::string::npos);
  EXPECT_EQ(snap.stats.requested_bytes.current, 5000 + (3 << 20));
  const std::string json = tmem::snapshot_to_json(snap);
  for (const char* key : {"\"schema\":\"tandem.memory.snapshot/1\"", "\"segments\"", "\"blocks\"", "\"state\":\"free\"",
                          "\"sites\"", "\"timeline\"", "\"allocated_bytes\"", "tandem_test_leaky_site"})
    EXPECT_NE(json.find(key), std::string::npos) << key;
  stack.top().deallocate(a, 5000);
  stack.top().deallocate(b, 3 << 20);
}

}  // namespace
