// The Chrome-trace writer (base/chrome_trace.h).
#include "base/chrome_trace.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>

namespace tandem {

void append_trace_time(std::string& out, double v) {
  char buf[40];
  if (std::isfinite(v) && std::trunc(v) == v && std::fabs(v) < 9.0e15) {
    std::snprintf(buf, sizeof buf, "%" PRId64, static_cast<int64_t>(v));
  } else if (std::isfinite(v)) {
    std::snprintf(buf, sizeof buf, "%.3f", v);
  } else {
    std::snprintf(buf, sizeof buf, "0");  // JSON has no NaN/Infinity
  }
  out += buf;
}

ChromeTraceWriter::ChromeTraceWriter() : out_("{\"traceEvents\":[\n") {}

void ChromeTraceWriter::separate() {
  if (!first_) out_ += ",\n";
  first_ = false;
}

void ChromeTraceWriter::event(const ChromeTraceEvent& e) {
  separate();
  out_ += "{\"name\":";
  append_json_string(out_, e.name);
  if (!e.category.empty()) {
    out_ += ",\"cat\":";
    append_json_string(out_, e.category);
  }
  out_ += ",\"ph\":";
  append_json_string(out_, std::string_view(&e.phase, 1));
  out_ += ",\"ts\":";
  append_trace_time(out_, e.ts_us);
  out_ += ",\"pid\":" + std::to_string(e.pid) + ",\"tid\":" + std::to_string(e.tid);
  if (e.phase == 'X') {
    out_ += ",\"dur\":";
    append_trace_time(out_, e.dur_us);
  }
  if (e.phase == 'b' || e.phase == 'e') out_ += ",\"id\":" + std::to_string(e.id);
  if (e.phase == 'i') out_ += ",\"s\":\"t\"";
  out_ += ",\"args\":{";
  out_ += e.args;
  out_ += "}}";
}

void ChromeTraceWriter::metadata(std::string_view name, int64_t pid, int64_t tid,
                                 std::string_view args) {
  separate();
  out_ += "{\"name\":";
  append_json_string(out_, name);
  out_ += ",\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) +
          ",\"args\":{";
  out_ += args;
  out_ += "}}";
}

void ChromeTraceWriter::event(const JsonValue& e) {
  separate();
  out_ += e.dump();
}

void ChromeTraceWriter::finish(const JsonValue& other_data) {
  out_ += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":";
  out_ += other_data.dump();
  out_ += "}\n";
}

}  // namespace tandem
