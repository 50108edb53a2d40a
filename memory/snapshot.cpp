// Snapshots: collection down a stack and JSON output (nlohmann-json).
#include <tandem/memory/snapshot.h>

#include <tandem/base/errors.h>

#include "memory/stats_json.h"

#include <cstdio>
#include <fstream>

namespace tandem::memory {

const char* to_string(BlockState state) {
  switch (state) {
    case BlockState::kAllocated: return "allocated";
    case BlockState::kThreadCached: return "thread_cached";
    case BlockState::kFree: return "free";
  }
  return "unknown";
}

Snapshot take_snapshot(const MemoryResource& resource) {
  Snapshot s;
  resource.collect_snapshot(s);
  resource.collect_stats(s.stats);
  return s;
}

namespace {
// Compact JSON; bytes of a frame that are not valid UTF-8 (a symbol from a file with an odd name)
// become U+FFFD rather than making the whole snapshot unreadable.
std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}
}  // namespace

std::string snapshot_to_json(const Snapshot& snap) {
  using nlohmann::ordered_json;
  ordered_json segments = ordered_json::array();
  for (const auto& seg : snap.segments) {
    ordered_json blocks = ordered_json::array();
    for (const auto& b : seg.blocks) {
      blocks.push_back({{"address", b.address}, {"size", b.size}, {"requested", b.requested},
                        {"state", to_string(b.state)}, {"step", b.step}, {"time_ns", b.time_ns},
                        {"site", b.site}});
    }
    segments.push_back({{"address", seg.address}, {"size", seg.size}, {"stream", seg.stream.value},
                        {"pool", seg.pool}, {"blocks", std::move(blocks)}});
  }
  ordered_json sites = ordered_json::array();
  for (const auto& s : snap.sites) {
    char id[24];
    std::snprintf(id, sizeof id, "%llx", static_cast<unsigned long long>(s.id));
    sites.push_back({{"id", id}, {"label", s.label}, {"frames", s.frames}});
  }
  ordered_json timeline = ordered_json::array();
  for (const auto& t : snap.timeline) {
    timeline.push_back({{"step", t.step}, {"time_ns", t.time_ns}, {"live_bytes", t.live_bytes},
                        {"reserved_bytes", t.reserved_bytes}});
  }
  const ordered_json doc = {{"schema", "tandem.memory.snapshot/1"},
                            {"stats", detail::stats_json(snap.stats)},
                            {"segments", std::move(segments)},
                            {"sites", std::move(sites)},
                            {"timeline", std::move(timeline)}};
  return dump(doc) + "\n";
}

void write_snapshot_json(const Snapshot& snapshot, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error("tandem: cannot open '" + path + "' to write a memory snapshot; check the directory exists and is writable");
  f << snapshot_to_json(snapshot);
  f.close();
  if (!f) throw Error("tandem: writing memory snapshot '" + path + "' failed (disk full?)");
}

}  // namespace tandem::memory
