// Merging rank timelines (trace_merge.h).
#include "tools/trace-tools/trace_merge.h"

#include <tandem/base/errors.h>
#include <tandem/base/file_system.h>

#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "base/strings.h"

namespace tandem::trace {

namespace {

// "rank12.json" -> 12; -1 for anything else.
int rank_of_file_name(const std::string& name) {
  const std::string prefix = "rank", suffix = ".json";
  if (!strings::starts_with(name, prefix) || !strings::ends_with(name, suffix)) return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return static_cast<int>(*strings::parse_int(digits));
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error("tandem-trace: cannot open '" + path + "' (" + std::strerror(errno) +
                "); check the path.");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

JsonValue parse(const std::string& text, const std::string& source) {
  JsonValue v;
  try {
    v = parse_json(text);
  } catch (const Error& e) {
    throw Error("tandem-trace: '" + source + "' is not valid JSON: " + e.what() +
                ". A rank that died before trace::stop() leaves no file; a truncated file "
                "cannot be merged: delete it and merge the others.");
  }
  const JsonValue* events = v.find("traceEvents");
  if (!v.is_object() || events == nullptr || !events->is_array()) {
    throw Error("tandem-trace: '" + source +
                "' is JSON but not a Chrome trace (no \"traceEvents\" array).");
  }
  return v;
}

// Earliest timestamp among events that have one.
double earliest_ts(const JsonValue& trace) {
  double t = std::numeric_limits<double>::infinity();
  for (const auto& e : trace.at("traceEvents", "traceEvents").as_array("traceEvents")) {
    if (!e.is_object()) continue;
    const JsonValue* ph = e.find("ph");
    if (ph != nullptr && ph->is_string() && ph->as_string("ph") == "M") continue;
    const JsonValue* ts = e.find("ts");
    if (ts != nullptr && ts->is_number()) t = std::min(t, ts->as_double("ts"));
  }
  return t;
}

JsonValue shifted_ts(const JsonValue& ts, double origin) {
  if (ts.is_int() && origin == std::floor(origin)) {
    return JsonValue(ts.as_int("ts") - static_cast<int64_t>(origin));
  }
  return JsonValue(ts.as_double("ts") - origin);
}

}  // namespace

std::vector<RankTrace> read_rank_traces(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    throw Error("tandem-trace: cannot read the trace directory '" + dir + "' (" +
                std::strerror(errno) + "); pass the directory the ranks wrote (trace.dir).");
  }
  std::vector<RankTrace> out;
  while (dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    const int rank = rank_of_file_name(name);
    if (rank < 0) continue;
    RankTrace r;
    r.rank = rank;
    r.source = dir + "/" + name;
    out.push_back(std::move(r));
  }
  ::closedir(d);
  if (out.empty()) {
    throw Error("tandem-trace: no rank<R>.json files in '" + dir +
                "'; run the workers with trace.enabled=true and trace.dir=" + dir + ".");
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (auto& r : out) r.text = read_whole_file(r.source);
  return out;
}

JsonValue merge_traces(const std::vector<RankTrace>& ranks) {
  std::vector<JsonValue> parsed;
  double origin = std::numeric_limits<double>::infinity();
  for (const auto& r : ranks) {
    parsed.push_back(parse(r.text, r.source));
    origin = std::min(origin, earliest_ts(parsed.back()));
  }
  if (!std::isfinite(origin)) origin = 0;
  origin = std::floor(origin);
  JsonValue events = JsonValue::array();
  JsonValue rank_data = JsonValue::array();
  for (size_t i = 0; i < ranks.size(); ++i) {
    const JsonValue& trace = parsed[i];
    for (const auto& e : trace.at("traceEvents", "traceEvents").as_array("traceEvents")) {
      if (!e.is_object()) {
        throw Error("tandem-trace: '" + ranks[i].source + "': an entry of traceEvents is not an "
                    "object; the file is damaged.");
      }
      JsonValue copy = JsonValue::object();
      copy.set("pid", JsonValue(ranks[i].rank));  // pid = rank, whatever the file said
      for (const auto& [key, value] : e.as_object("event")) {
        if (key == "pid") continue;
        if (key == "ts" && value.is_number()) {
          copy.set(key, shifted_ts(value, origin));
        } else {
          copy.set(key, value);
        }
      }
      events.push_back(std::move(copy));
    }
    JsonValue info = JsonValue::object();
    info.set("rank", JsonValue(ranks[i].rank));
    info.set("file", JsonValue(ranks[i].source));
    if (const JsonValue* other = trace.find("otherData"); other != nullptr && other->is_object()) {
      for (const auto& [key, value] : other->as_object("otherData")) {
        if (key != "rank") info.set(key, value);
      }
    }
    rank_data.push_back(std::move(info));
  }
  JsonValue other = JsonValue::object();
  other.set("tandem_trace_version", JsonValue(1));
  other.set("origin_us", JsonValue(static_cast<int64_t>(origin)));
  other.set("ranks", std::move(rank_data));
  JsonValue out = JsonValue::object();
  out.set("traceEvents", std::move(events));
  out.set("displayTimeUnit", JsonValue("ms"));
  out.set("otherData", std::move(other));
  return out;
}

void write_text_file(const std::string& path, const std::string& text) {
  try {
    posix_file_system()->write_file_atomically(path, text);
  } catch (const CheckpointError& e) {
    // The FileSystem words its errors for checkpoints; this is a timeline.
    std::string what = e.what();
    if (strings::starts_with(what, "tandem: checkpoint: ")) what.erase(0, 20);
    throw Error("tandem-trace: cannot write '" + path + "': " + what +
                " Check the directory exists and is writable.");
  }
}

JsonValue merge_trace_dir(const std::string& dir, const std::string& out_path) {
  JsonValue merged = merge_traces(read_rank_traces(dir));
  write_text_file(out_path, merged.dump() + "\n");
  return merged;
}

JsonValue read_trace_file(const std::string& path) { return parse(read_whole_file(path), path); }

}  // namespace tandem::trace
