// LeakDetector: steady growth of live bytes per allocation site over a window of steps.
#include <tandem/memory/leak_detector.h>

#include <cstdio>
#include <sstream>

#include <tandem/memory/memory_stats.h>

namespace tandem::memory {

LeakDetector::LeakDetector(TrackingResource& tracker, LeakDetectorOptions options)
    : tracker_(tracker), options_(std::move(options)) {
  if (options_.window < 2) options_.window = 2;
}

std::vector<LeakReport> LeakDetector::mark_step() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::int64_t step = tracker_.mark_step();
  std::vector<LeakReport> found;
  const std::size_t w = options_.window;
  for (const SiteLive& s : tracker_.live_by_site_fast()) {
    auto& h = history_[s.site];
    h.push_back(s.live_bytes);
    if (h.size() > w + 1) h.pop_front();
    if (h.size() < w + 1 || reported_.count(s.site)) continue;
    std::size_t ups = 0;
    std::int64_t rise = 0, fall = 0;
    for (std::size_t i = 1; i < h.size(); ++i) {
      const std::int64_t d = h[i] - h[i - 1];
      if (d > 0) {
        ++ups;
        rise += d;
      } else {
        fall -= d;
      }
    }
    const std::int64_t growth = h.back() - h.front();
    if (static_cast<double>(ups) < options_.min_growing_fraction * static_cast<double>(w) || fall > rise / 2 ||
        growth < options_.min_bytes_per_step * static_cast<std::int64_t>(w))
      continue;
    LeakReport r;
    r.site = tracker_.site_info(s.site);
    r.step = step;
    r.window = static_cast<std::int64_t>(w);
    r.bytes_per_step = growth / static_cast<std::int64_t>(w);
    r.live_bytes = s.live_bytes;
    r.live_count = s.live_count;
    std::ostringstream m;
    m << "tandem: possible leak: site " << r.site.label << " gained " << format_bytes(r.bytes_per_step)
      << " per step for " << w << " steps, live " << format_bytes(r.live_bytes) << " in " << r.live_count
      << " allocations (step " << step << ")";
    if (s.site == 0) m << "; stacks are not captured (TrackingOptions::stacks) so the site is unknown";
    m << "\n";
    for (const auto& f : r.site.frames) m << "    " << f << "\n";
    r.message = m.str();
    reported_.insert(s.site);
    if (options_.on_leak) options_.on_leak(r);
    else std::fputs(r.message.c_str(), stderr);
    reports_.push_back(r);
    found.push_back(std::move(r));
  }
  return found;
}

std::vector<LeakReport> LeakDetector::reports() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reports_;
}

}  // namespace tandem::memory
