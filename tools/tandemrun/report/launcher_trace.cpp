// tandemrun --trace-dir (launcher_trace.h).
#include "tools/tandemrun/report/launcher_trace.h"

#include <tandem/base/errors.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tools/trace-tools/trace_merge.h"
#include "tools/trace-tools/trace_summary.h"
#include "tools/trace-tools/trace_svg.h"

namespace tandem::trace {

namespace {

void say(const std::string& text) {
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    out += "tandemrun: " + text.substr(start, end - start) + "\n";
    start = end + 1;
  }
  std::fputs(out.c_str(), stderr);
  std::fflush(stderr);
}

bool is_stale(const std::string& name) {
  if (name == "timeline.json" || name == "timeline.svg") return true;
  const bool json = name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0;
  return json && name.compare(0, 4, "rank") == 0;
}

}  // namespace

bool prepare_trace_dir(const std::string& dir, std::vector<std::string>& env) {
  std::string path;
  for (size_t pos = 0; pos != std::string::npos;) {
    pos = dir.find('/', pos + 1);
    path = dir.substr(0, pos);
    if (!path.empty() && ::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      say("--trace-dir: cannot create '" + dir + "' (" + std::strerror(errno) +
          "); tracing is off for this run");
      return false;
    }
  }
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* entry = ::readdir(d)) {
      if (is_stale(entry->d_name)) ::unlink((dir + "/" + entry->d_name).c_str());
    }
    ::closedir(d);
  }
  const std::string entry = "TANDEM_TRACE_DIR=" + dir;
  bool replaced = false;
  for (auto& e : env) {
    if (e.rfind("TANDEM_TRACE_DIR=", 0) == 0) {
      e = entry;
      replaced = true;
    }
  }
  if (!replaced) env.push_back(entry);
  return true;
}

bool report_trace_dir(const std::string& dir) {
  const std::string out = dir + "/timeline.json";
  try {
    const JsonValue merged = merge_trace_dir(dir, out);
    const TimelineSummary summary = summarize(merged);
    const std::string picture = dir + "/timeline.svg";
    write_text_file(picture, timeline_svg(merged));
    say("timeline of " + std::to_string(summary.ranks.size()) + " rank(s) written to " + out +
        " (open it in https://ui.perfetto.dev) and drawn in " + picture + "\n" +
        format_summary(summary));
    return true;
  } catch (const Error& e) {
    say(std::string("--trace-dir: no timeline: ") + e.what());
    return false;
  }
}

}  // namespace tandem::trace
