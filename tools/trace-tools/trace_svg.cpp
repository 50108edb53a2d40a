// tandem-trace svg (trace_svg.h): lanes per rank and thread, spans coloured by category, drawn
// through base's SvgWriter.
#include "tools/trace-tools/trace_svg.h"

#include <tandem/base/errors.h>

#include "base/svg_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <tuple>
#include <vector>

namespace tandem::trace {
namespace {

constexpr double kRowHeight = 14;   // one nesting level
constexpr double kLabelWidth = 150;  // lane names on the left
constexpr double kMinWidthPx = 0.33;

struct Span {
  double start_us = 0, dur_us = 0;
  std::string name, category, tooltip;
  int depth = 0;
};

struct Lane {
  std::string label;
  std::vector<Span> spans;
  int depth_count = 1;
};

const char* colour(const std::string& category) {
  if (category == "compute") return "#4e79a7";
  if (category == "comm") return "#f28e2b";
  if (category == "codec") return "#b07aa1";
  if (category == "wait") return "#bab0ac";
  if (category == "pipeline") return "#edc948";
  if (category == "checkpoint") return "#59a14f";
  return "#9c755f";
}

std::string ms(double us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, us < 1000 ? "%.3f ms" : "%.1f ms", us / 1000);
  return buf;
}

std::string tooltip_of(const JsonValue& e, const std::string& name, double dur_us) {
  std::string text = name + " — " + ms(dur_us);
  if (const JsonValue* args = e.find("args"); args != nullptr && args->is_object()) {
    for (const auto& [key, value] : args->as_object("args"))
      text += "\n" + key + ": " + (value.is_string() ? value.as_string(key) : value.dump());
  }
  return text;
}

// Depths so that a span nested in another (same lane) sits one row below it.
void assign_depths(Lane& lane) {
  std::sort(lane.spans.begin(), lane.spans.end(), [](const Span& a, const Span& b) {
    return a.start_us != b.start_us ? a.start_us < b.start_us : a.dur_us > b.dur_us;
  });
  std::vector<double> open_ends;  // end of the open span at each depth
  for (auto& s : lane.spans) {
    while (!open_ends.empty() && open_ends.back() <= s.start_us) open_ends.pop_back();
    s.depth = static_cast<int>(open_ends.size());
    open_ends.push_back(s.start_us + s.dur_us);
    lane.depth_count = std::max(lane.depth_count, s.depth + 1);
  }
}

double nice_step(double span_ms) {
  const double raw = span_ms / 10;
  const double p = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (raw <= m * p) return m * p;
  }
  return 10 * p;
}

}  // namespace

std::string timeline_svg(const JsonValue& trace, const SvgOptions& options) {
  const JsonValue* events = trace.is_object() ? trace.find("traceEvents") : nullptr;
  if (events == nullptr || !events->is_array())
    throw Error("tandem-trace svg: the input is not a Chrome trace (no \"traceEvents\" array).");

  // Lanes keyed by (rank, async?, tid); names from metadata.
  std::map<std::tuple<int64_t, int, int64_t>, Lane> lanes;
  std::map<std::pair<int64_t, int64_t>, std::string> thread_names;
  std::map<std::tuple<int64_t, std::string, int64_t, std::string>, const JsonValue*> open_async;
  double first_us = INFINITY, last_us = -INFINITY;
  for (const auto& e : events->as_array("traceEvents")) {
    const JsonValue* ph = e.find("ph");
    if (ph == nullptr || !ph->is_string()) continue;
    const std::string& phase = ph->as_string("ph");
    const int64_t pid = e.find("pid") ? e.at("pid", "pid").as_int("pid") : 0;
    const int64_t tid = e.find("tid") && e.at("tid", "tid").is_int() ? e.at("tid", "tid").as_int("tid") : 0;
    const std::string name = e.find("name") ? e.at("name", "name").as_string("name") : "";
    const std::string cat =
        e.find("cat") && e.at("cat", "cat").is_string() ? e.at("cat", "cat").as_string("cat") : "";
    if (phase == "M" && name == "thread_name") {
      if (const JsonValue* args = e.find("args"); args && args->find("name"))
        thread_names[{pid, tid}] = args->at("name", "name").as_string("thread name");
      continue;
    }
    if (phase == "X") {
      const double ts = e.at("ts", "ts").as_double("ts"), dur = e.at("dur", "dur").as_double("dur");
      lanes[{pid, 0, tid}].spans.push_back({ts, dur, name, cat, tooltip_of(e, name, dur)});
      first_us = std::min(first_us, ts);
      last_us = std::max(last_us, ts + dur);
    } else if (phase == "b" || phase == "e") {
      const int64_t id = e.find("id") && e.at("id", "id").is_int() ? e.at("id", "id").as_int("id") : 0;
      const auto key = std::make_tuple(pid, cat, id, name);
      if (phase == "b") {
        open_async[key] = &e;
      } else if (auto it = open_async.find(key); it != open_async.end()) {
        const double ts = it->second->at("ts", "ts").as_double("ts");
        const double end = e.at("ts", "ts").as_double("ts");
        lanes[{pid, 1, 0}].spans.push_back(
            {ts, end - ts, name, cat, tooltip_of(*it->second, name, end - ts)});
        open_async.erase(it);
        first_us = std::min(first_us, ts);
        last_us = std::max(last_us, end);
      }
    }
  }
  if (lanes.empty()) throw Error("tandem-trace svg: the timeline holds no spans to draw.");

  const double from_us = first_us + options.from_ms * 1000;
  const double to_us = options.to_ms > 0 ? first_us + options.to_ms * 1000 : last_us;
  if (!(to_us > from_us))
    throw Error("tandem-trace svg: the window " + ms(options.from_ms * 1000) + " .. " +
                ms(options.to_ms * 1000) + " is empty (the timeline lasts " +
                ms(last_us - first_us) + "); choose --from-ms below --to-ms within it.");
  const double width = std::max(200, options.width);
  const double px_per_us = width / (to_us - from_us);

  // Layout first (where each rank band and lane goes, which spans are wide enough), so that the
  // caption can count them and the axis reach the bottom; then draw in painting order.
  struct Placed {
    const Lane* lane;
    double top;
    int64_t pid;
    double band_y;  // >= 0: the lane opens its rank's band, whose label goes there
  };
  std::vector<Placed> placed;
  double y = 56;
  int64_t drawn = 0, too_narrow = 0;
  auto visible = [&](const Span& s, double* x0, double* w) {
    *x0 = std::max(s.start_us, from_us);
    const double x1 = std::min(s.start_us + s.dur_us, to_us);
    *w = (x1 - *x0) * px_per_us;
    return x1 > *x0;
  };
  for (auto& [key, lane] : lanes) {
    const auto [pid, async, tid] = key;
    double band_y = -1;
    if (placed.empty() || placed.back().pid != pid) {
      band_y = y;
      y += 18;
    }
    lane.label = async ? "async (bucket reduces)"
                       : (thread_names.count({pid, tid}) ? thread_names[{pid, tid}]
                                                         : "thread " + std::to_string(tid));
    assign_depths(lane);
    placed.push_back({&lane, y, pid, band_y});
    for (const auto& s : lane.spans) {
      double x0 = 0, w = 0;
      if (!visible(s, &x0, &w)) continue;
      ++(w < kMinWidthPx ? too_narrow : drawn);
    }
    y += lane.depth_count * kRowHeight + 4;
  }

  SvgWriter svg;
  svg.text(4, 15,
           "tandem timeline: " + ms(to_us - from_us) + " shown, " + std::to_string(drawn) +
               " spans drawn" +
               (too_narrow ? ", " + std::to_string(too_narrow) +
                                 " narrower than a third of a pixel left out (zoom with "
                                 "--from-ms/--to-ms)"
                           : std::string()),
           "font-size=\"14\"");
  double lx = kLabelWidth;
  for (const char* c : {"compute", "comm", "codec", "wait", "checkpoint", "pipeline"}) {
    svg.rect(lx, 22, 10, 10, std::string("fill=\"") + colour(c) + "\"");
    svg.text(lx + 14, 31, c, "class=\"axis\"");
    lx += 90;
  }
  // Axis: ticks every "nice" number of milliseconds.
  const double step_ms = nice_step((to_us - from_us) / 1000);
  for (double t = std::ceil(options.from_ms / step_ms) * step_ms; first_us + t * 1000 <= to_us;
       t += step_ms) {
    const double x = kLabelWidth + (first_us + t * 1000 - from_us) * px_per_us;
    std::ostringstream label;
    label << t << " ms";
    svg.line(x, 40, x, y, "class=\"tick\"");
    svg.text(x + 2, 50, label.str(), "class=\"axis\"");
  }
  for (const auto& [lane, top, pid, band_y] : placed) {
    if (band_y >= 0) svg.text(4, band_y + 12, "rank " + std::to_string(pid), "class=\"rank\"");
    svg.rect(kLabelWidth, top, width, lane->depth_count * kRowHeight, "class=\"lane\"");
    svg.text(12, top + 11, lane->label, "class=\"label\"");
    for (const auto& s : lane->spans) {
      double x0 = 0, w = 0;
      if (!visible(s, &x0, &w) || w < kMinWidthPx) continue;
      const bool outline = s.category == "pipeline";
      const double x = kLabelWidth + (x0 - from_us) * px_per_us;
      svg.rect(x, top + s.depth * kRowHeight + 1, w, kRowHeight - 2,
               outline ? std::string("fill=\"none\" stroke=\"#edc948\"")
                       : std::string("fill=\"") + colour(s.category) + "\"",
               s.tooltip);
      if (w > 7.0 * static_cast<double>(s.name.size()))
        svg.text(x + 2, top + s.depth * kRowHeight + 10, s.name, "class=\"span\"");
    }
  }
  return svg.finish(kLabelWidth + width + 40,  // room for the last tick label
                    y + 24, {},
                    ".lane{fill:#f7f7f7}.label{font-size:11px;fill:#333}.rank{font-size:13px;"
                    "font-weight:bold}.axis{font-size:10px;fill:#555}.span{font-size:9px;fill:#fff;"
                    "pointer-events:none}.tick{stroke:#ddd}");
}

}  // namespace tandem::trace
