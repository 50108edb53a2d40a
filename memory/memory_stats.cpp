// Formatting of MemoryStats: a text table and JSON (nlohmann-json).
#include <tandem/memory/memory_stats.h>

#include "memory/stats_json.h"

#include <cstdio>
#include <sstream>

namespace tandem::memory {

double MemoryStats::fragmentation() const {
  const std::int64_t free_cached = reserved_bytes.current - active_bytes.current;
  if (free_cached <= 0 || largest_free_block <= 0) return 0.0;
  const double f = 1.0 - static_cast<double>(largest_free_block) / static_cast<double>(free_cached);
  return f < 0.0 ? 0.0 : f;
}

std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes < 0 ? -bytes : bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%s%lld B", bytes < 0 ? "-" : "", static_cast<long long>(v));
  else std::snprintf(buf, sizeof buf, "%s%.1f %s", bytes < 0 ? "-" : "", v, units[u]);
  return buf;
}

namespace {
const std::pair<const char*, Stat MemoryStats::*> kStats[] = {
    {"allocated_bytes", &MemoryStats::allocated_bytes},
    {"reserved_bytes", &MemoryStats::reserved_bytes},
    {"active_bytes", &MemoryStats::active_bytes},
    {"inactive_split_bytes", &MemoryStats::inactive_split_bytes},
    {"requested_bytes", &MemoryStats::requested_bytes},
    {"allocations", &MemoryStats::allocations},
    {"segments", &MemoryStats::segments},
    {"active_blocks", &MemoryStats::active_blocks},
    {"inactive_split_blocks", &MemoryStats::inactive_split_blocks},
    {"requests", &MemoryStats::requests},
};
const std::pair<const char*, std::int64_t MemoryStats::*> kCounters[] = {
    {"cache_hits", &MemoryStats::cache_hits},
    {"cache_misses", &MemoryStats::cache_misses},
    {"thread_cache_hits", &MemoryStats::thread_cache_hits},
    {"alloc_retries", &MemoryStats::alloc_retries},
    {"ooms", &MemoryStats::ooms},
    {"largest_free_block", &MemoryStats::largest_free_block},
    {"limit_bytes", &MemoryStats::limit_bytes},
};
bool is_bytes(const char* name) { return std::string(name).find("bytes") != std::string::npos; }
}  // namespace

std::string format_stats(const MemoryStats& s) {
  std::ostringstream o;
  char line[200];
  std::snprintf(line, sizeof line, "%-22s %12s %12s %14s %14s\n", "stat", "current", "peak", "total", "freed");
  o << line;
  for (const auto& [name, field] : kStats) {
    const Stat& st = s.*field;
    auto f = [&](std::int64_t v) { return is_bytes(name) ? format_bytes(v) : std::to_string(v); };
    std::snprintf(line, sizeof line, "%-22s %12s %12s %14s %14s\n", name, f(st.current).c_str(),
                  f(st.peak).c_str(), f(st.total).c_str(), f(st.freed).c_str());
    o << line;
  }
  std::snprintf(line, sizeof line, "cache hit rate %.1f%% (%lld hits, %lld misses, %lld from thread caches)\n",
                100.0 * s.cache_hit_rate(), static_cast<long long>(s.cache_hits),
                static_cast<long long>(s.cache_misses), static_cast<long long>(s.thread_cache_hits));
  o << line;
  o << "largest free block " << format_bytes(s.largest_free_block) << ", fragmentation "
    << static_cast<int>(100.0 * s.fragmentation() + 0.5) << "%, retries " << s.alloc_retries << ", OOMs "
    << s.ooms;
  if (s.limit_bytes > 0) o << ", limit " << format_bytes(s.limit_bytes);
  o << "\n";
  return o.str();
}

nlohmann::ordered_json detail::stats_json(const MemoryStats& s) {
  nlohmann::ordered_json o = nlohmann::ordered_json::object();
  for (const auto& [name, field] : kStats) {
    const Stat& st = s.*field;
    o[name] = {{"current", st.current}, {"peak", st.peak}, {"total", st.total}, {"freed", st.freed}};
  }
  for (const auto& [name, field] : kCounters) o[name] = s.*field;
  o["cache_hit_rate"] = s.cache_hit_rate();
  o["fragmentation"] = s.fragmentation();
  return o;
}

std::string stats_to_json(const MemoryStats& s) { return detail::stats_json(s).dump(); }

}  // namespace tandem::memory
