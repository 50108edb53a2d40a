// Snapshots: collection down a stack and JSON output.
#include <tandem/memory/snapshot.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <tandem/base/errors.h>

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
void json_string(std::ostream& o, const std::string& s) {
  o << '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': o << "\\\""; break;
      case '\\': o << "\\\\"; break;
      case '\n': o << "\\n"; break;
      case '\t': o << "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o << buf;
        } else {
          o << c;
        }
    }
  }
  o << '"';
}
}  // namespace

std::string snapshot_to_json(const Snapshot& snap) {
  std::ostringstream o;
  o << "{\"schema\":\"tandem.memory.snapshot/1\",\n\"stats\":" << stats_to_json(snap.stats) << ",\n\"segments\":[";
  for (std::size_t i = 0; i < snap.segments.size(); ++i) {
    const auto& seg = snap.segments[i];
    o << (i ? ",\n" : "\n") << "{\"address\":" << seg.address << ",\"size\":" << seg.size
      << ",\"stream\":" << seg.stream.value << ",\"pool\":";
    json_string(o, seg.pool);
    o << ",\"blocks\":[";
    for (std::size_t j = 0; j < seg.blocks.size(); ++j) {
      const auto& b = seg.blocks[j];
      o << (j ? "," : "") << "{\"address\":" << b.address << ",\"size\":" << b.size << ",\"requested\":" << b.requested
        << ",\"state\":\"" << to_string(b.state) << "\",\"step\":" << b.step << ",\"time_ns\":" << b.time_ns
        << ",\"site\":" << b.site << "}";
    }
    o << "]}";
  }
  o << "],\n\"sites\":[";
  for (std::size_t i = 0; i < snap.sites.size(); ++i) {
    const auto& s = snap.sites[i];
    o << (i ? ",\n" : "\n") << "{\"id\":\"" << std::hex << s.id << std::dec << "\",\"label\":";
    json_string(o, s.label);
    o << ",\"frames\":[";
    for (std::size_t j = 0; j < s.frames.size(); ++j) {
      if (j) o << ",";
      json_string(o, s.frames[j]);
    }
    o << "]}";
  }
  o << "],\n\"timeline\":[";
  for (std::size_t i = 0; i < snap.timeline.size(); ++i) {
    const auto& t = snap.timeline[i];
    o << (i ? "," : "") << "{\"step\":" << t.step << ",\"time_ns\":" << t.time_ns << ",\"live_bytes\":" << t.live_bytes
      << ",\"reserved_bytes\":" << t.reserved_bytes << "}";
  }
  o << "]}\n";
  return o.str();
}

void write_snapshot_json(const Snapshot& snapshot, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error("tandem: cannot open '" + path + "' to write a memory snapshot; check the directory exists and is writable");
  f << snapshot_to_json(snapshot);
  f.close();
  if (!f) throw Error("tandem: writing memory snapshot '" + path + "' failed (disk full?)");
}

}  // namespace tandem::memory
