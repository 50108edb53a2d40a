// Merging rank timelines (trace_merge.h); files through base's FileSystem, the merged timeline
// through base's ChromeTraceWriter.
#include "tools/trace-tools/trace_merge.h"

#include <tandem/base/errors.h>
#include <tandem/base/file_system.h>

#include "base/chrome_trace.h"
#include "base/strings.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

JsonValue parse(const std::string& text, const std::string& source) {
  JsonValue v;
  try {
    v = parse_json(text, JsonErrors::kPlain);
  } catch (const JsonError& e) {
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

std::string read_text_file(const std::string& path) {
  try {
    return posix_file_system()->read_file(path);
  } catch (const Error& e) {  // base's words: the operation, the path, the OS error
    throw Error(std::string("tandem-trace: ") + e.what());
  }
}

// A value built here raises its errors as a trace's (JsonError, for tandem-trace to word).
JsonValue plain(JsonValue v) {
  v.set_errors(JsonErrors::kPlain);
  return v;
}

JsonValue shifted_ts(const JsonValue& ts, double origin) {
  if (ts.is_int() && origin == std::floor(origin)) {
    return JsonValue(ts.as_int("ts") - static_cast<int64_t>(origin));
  }
  return JsonValue(ts.as_double("ts") - origin);
}

}  // namespace

std::vector<RankTrace> read_rank_traces(const std::string& dir) {
  const auto fs = posix_file_system();
  if (!fs->is_directory(dir)) {
    throw Error("tandem-trace: '" + dir + "' is not a directory; pass the directory the ranks "
                "wrote (trace.dir).");
  }
  std::vector<RankTrace> out;
  for (const std::string& name : fs->list_dir(dir)) {
    const int rank = rank_of_file_name(name);
    if (rank < 0) continue;
    RankTrace r;
    r.rank = rank;
    r.source = join_path(dir, name);
    out.push_back(std::move(r));
  }
  if (out.empty()) {
    throw Error("tandem-trace: no rank<R>.json files in '" + dir +
                "'; run the workers with trace.enabled=true and trace.dir=" + dir + ".");
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (auto& r : out) r.text = read_text_file(r.source);
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
  JsonValue events = plain(JsonValue::array());
  JsonValue rank_data = plain(JsonValue::array());
  for (size_t i = 0; i < ranks.size(); ++i) {
    const JsonValue& trace = parsed[i];
    for (const auto& e : trace.at("traceEvents", "traceEvents").as_array("traceEvents")) {
      if (!e.is_object()) {
        throw Error("tandem-trace: '" + ranks[i].source + "': an entry of traceEvents is not an "
                    "object; the file is damaged.");
      }
      JsonValue copy = plain(JsonValue::object());
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
    JsonValue info = plain(JsonValue::object());
    info.set("rank", JsonValue(ranks[i].rank));
    info.set("file", JsonValue(ranks[i].source));
    if (const JsonValue* other = trace.find("otherData"); other != nullptr && other->is_object()) {
      for (const auto& [key, value] : other->as_object("otherData")) {
        if (key != "rank") info.set(key, value);
      }
    }
    rank_data.push_back(std::move(info));
  }
  JsonValue other = plain(JsonValue::object());
  other.set("tandem_trace_version", JsonValue(1));
  other.set("origin_us", JsonValue(static_cast<int64_t>(origin)));
  other.set("ranks", std::move(rank_data));
  JsonValue out = plain(JsonValue::object());
  out.set("traceEvents", std::move(events));
  out.set("displayTimeUnit", JsonValue("ms"));
  out.set("otherData", std::move(other));
  return out;
}

void write_text_file(const std::string& path, const std::string& text) {
  try {
    posix_file_system()->write_file_atomically(path, text);
  } catch (const Error& e) {  // base's words: the operation, the path, the OS error
    throw Error(std::string("tandem-trace: ") + e.what());
  }
}

std::string trace_text(const JsonValue& trace) {
  ChromeTraceWriter writer;
  for (const auto& e : trace.at("traceEvents", "trace").as_array("traceEvents")) writer.event(e);
  const JsonValue* other = trace.find("otherData");
  writer.finish(other != nullptr ? *other : JsonValue::object());
  return std::move(writer.text());
}

JsonValue merge_trace_dir(const std::string& dir, const std::string& out_path) {
  JsonValue merged = merge_traces(read_rank_traces(dir));
  write_text_file(out_path, trace_text(merged));
  return merged;
}

JsonValue read_trace_file(const std::string& path) { return parse(read_text_file(path), path); }

}  // namespace tandem::trace
