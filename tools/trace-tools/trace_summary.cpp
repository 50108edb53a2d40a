// Timeline summary (trace_summary.h).
#include "tools/trace-tools/trace_summary.h"

#include <tandem/base/errors.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

namespace tandem::trace {

namespace {

using Interval = std::pair<double, double>;

// Sorted, disjoint cover of `v`.
std::vector<Interval> unite(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const auto& iv : v) {
    if (iv.second <= iv.first) continue;
    if (!out.empty() && iv.first <= out.back().second) {
      out.back().second = std::max(out.back().second, iv.second);
    } else {
      out.push_back(iv);
    }
  }
  return out;
}

double length(const std::vector<Interval>& u) {
  double total = 0;
  for (const auto& iv : u) total += iv.second - iv.first;
  return total;
}

// Length of the intersection of two unions (both sorted and disjoint).
double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first);
    const double hi = std::min(a[i].second, b[j].second);
    if (hi > lo) total += hi - lo;
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return total;
}

struct RankIntervals {
  std::vector<Interval> compute, comm, pipeline, checkpoint;
  double first = 0, last = 0;
  bool any = false;
  int64_t spans = 0;
  std::map<std::string, double> open_async;  // (cat, id, name) -> begin

  void touch(double begin, double end) {
    if (!any) {
      first = begin;
      last = end;
      any = true;
    }
    first = std::min(first, begin);
    last = std::max(last, end);
  }
  void add(const std::string& cat, double begin, double end) {
    ++spans;
    touch(begin, end);
    if (cat == "compute") {
      compute.emplace_back(begin, end);
    } else if (cat == "comm" || cat == "codec") {
      comm.emplace_back(begin, end);
    } else if (cat == "pipeline") {
      pipeline.emplace_back(begin, end);
    } else if (cat == "checkpoint") {
      checkpoint.emplace_back(begin, end);
    }
  }
};

std::string text_or_empty(const JsonValue& e, const char* key) {
  const JsonValue* v = e.find(key);
  return v != nullptr && v->is_string() ? v->as_string(key) : std::string();
}

double number_or(const JsonValue& e, const char* key, double fallback) {
  const JsonValue* v = e.find(key);
  return v != nullptr && v->is_number() ? v->as_double(key) : fallback;
}

}  // namespace

TimelineSummary summarize(const JsonValue& trace) {
  const JsonValue* events = trace.is_object() ? trace.find("traceEvents") : nullptr;
  if (events == nullptr || !events->is_array()) {
    throw Error("tandem-trace summary: the input is not a Chrome trace (no \"traceEvents\" array).");
  }
  std::map<int64_t, RankIntervals> by_rank;
  for (const auto& e : events->as_array("traceEvents")) {
    if (!e.is_object()) continue;
    const std::string ph = text_or_empty(e, "ph");
    const JsonValue* pid = e.find("pid");
    if (ph.empty() || ph == "M" || ph == "C" || pid == nullptr || !pid->is_int()) continue;
    RankIntervals& r = by_rank[pid->as_int("pid")];
    const std::string cat = text_or_empty(e, "cat");
    const double ts = number_or(e, "ts", 0);
    if (ph == "X") {
      r.add(cat, ts, ts + std::max(0.0, number_or(e, "dur", 0)));
    } else if (ph == "b" || ph == "e") {
      const JsonValue* id = e.find("id");
      const std::string key = cat + "\x1f" + (id != nullptr ? id->dump() : "") + "\x1f" +
                              text_or_empty(e, "name");
      if (ph == "b") {
        r.open_async[key] = ts;
      } else if (auto it = r.open_async.find(key); it != r.open_async.end()) {
        r.add(cat, it->second, std::max(ts, it->second));
        r.open_async.erase(it);
      }
    } else if (ph == "i" || ph == "I" || ph == "B" || ph == "E") {
      r.touch(ts, ts);
    }
  }
  TimelineSummary out;
  for (auto& [rank, r] : by_rank) {
    TimeSplit s;
    s.rank = static_cast<int>(rank);
    s.spans = r.spans;
    s.wall_us = r.any ? r.last - r.first : 0;
    const auto compute = unite(std::move(r.compute));
    const auto comm = unite(std::move(r.comm));
    const auto pipeline = unite(std::move(r.pipeline));
    s.compute_us = length(compute);
    s.comm_us = length(comm);
    s.overlap_us = overlap(comm, compute);
    s.exposed_comm_us = s.comm_us - s.overlap_us;
    s.bubble_us = length(pipeline) - overlap(pipeline, compute);
    s.checkpoint_us = length(unite(std::move(r.checkpoint)));
    out.ranks.push_back(s);
    TimeSplit& all = out.overall;
    all.wall_us += s.wall_us;
    all.compute_us += s.compute_us;
    all.comm_us += s.comm_us;
    all.overlap_us += s.overlap_us;
    all.exposed_comm_us += s.exposed_comm_us;
    all.bubble_us += s.bubble_us;
    all.checkpoint_us += s.checkpoint_us;
    all.spans += s.spans;
  }
  return out;
}

std::string format_summary(const TimelineSummary& summary) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-5s %10s %8s %8s %8s %8s %8s %8s %8s\n", "rank", "wall ms",
                "compute", "comm", "overlap", "exposed", "bubble", "ckpt", "hidden");
  out += line;
  auto row = [&](const TimeSplit& s, const std::string& name) {
    std::snprintf(line, sizeof line,
                  "%-5s %10.1f %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%%\n",
                  name.c_str(), s.wall_us / 1000.0, 100 * s.fraction(s.compute_us),
                  100 * s.fraction(s.comm_us), 100 * s.fraction(s.overlap_us),
                  100 * s.fraction(s.exposed_comm_us), 100 * s.fraction(s.bubble_us),
                  100 * s.fraction(s.checkpoint_us), 100 * s.overlap_share());
    out += line;
  };
  for (const auto& s : summary.ranks) row(s, std::to_string(s.rank));
  row(summary.overall, "all");
  out += "compute/comm/overlap/exposed/bubble/ckpt: share of wall time; hidden: share of comm "
         "that ran under compute (docs/timeline.md)\n";
  return out;
}

}  // namespace tandem::trace
