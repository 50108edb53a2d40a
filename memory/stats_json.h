// MemoryStats as a JSON object, shared by stats_to_json() and the snapshot writer. Not installed.
#pragma once

#include <tandem/memory/memory_stats.h>

#include <nlohmann/json.hpp>

namespace tandem::memory::detail {

// Every Stat as {"current","peak","total","freed"}, then the counters, the hit rate and the
// fragmentation, in a fixed order.
nlohmann::ordered_json stats_json(const MemoryStats& stats);

}  // namespace tandem::memory::detail
