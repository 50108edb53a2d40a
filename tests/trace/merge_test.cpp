// Merging rank timelines, the summary and the SVG picture, on crafted traces with known fractions (exact), plus
// tandemrun's --trace-dir helpers. Torch-free.
#include <gtest/gtest.h>
#include <tandem/base/errors.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "tools/trace-tools/trace_merge.h"
#include "tools/trace-tools/trace_summary.h"
#include "tools/trace-tools/trace_svg.h"
#include "tools/tandemrun/report/launcher_trace.h"

namespace tandem::trace {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tandem-trace-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Base wall-clock time of the crafted traces (microseconds since the epoch).
constexpr int64_t kBase = 1700000000000000;

std::string x(const char* name, const char* cat, int64_t ts, int64_t dur, int tid = 1) {
  return "{\"name\":\"" + std::string(name) + "\",\"cat\":\"" + cat + "\",\"ph\":\"X\",\"ts\":" +
         std::to_string(kBase + ts) + ",\"dur\":" + std::to_string(dur) +
         ",\"pid\":999,\"tid\":" + std::to_string(tid) + ",\"args\":{}}";
}

std::string async(const char* ph, int64_t ts, int id) {
  return "{\"name\":\"bucket 0 reduce\",\"cat\":\"comm\",\"ph\":\"" + std::string(ph) +
         "\",\"ts\":" + std::to_string(kBase + ts) + ",\"pid\":999,\"tid\":1,\"id\":" +
         std::to_string(id) + ",\"args\":{}}";
}

std::string trace_file(int rank, const std::vector<std::string>& events) {
  std::string s = "{\"traceEvents\":[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":999,\"tid\":0,"
                  "\"args\":{\"name\":\"rank " + std::to_string(rank) + "\"}}";
  for (const auto& e : events) s += "," + e;
  return s + "],\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":" + std::to_string(rank) +
         ",\"recorded_events\":" + std::to_string(events.size()) + ",\"dropped_events\":0}}";
}

// rank 0: compute [0,100) [150,250); comm [50,120) and bucket [200,300); checkpoint [260,290).
//   comm = 70 + 100 = 170, overlap = 50 + 50 = 100, exposed 70, wall 300.
// rank 1 (starts 10 us later): pipeline step [10,210); compute [10,60) [110,160); recv [60,110).
//   compute 100, comm 50 (exposed), bubble 200 - 100 = 100, wall 200.
void write_crafted(const std::string& dir) {
  write(dir + "/rank0.json",
        trace_file(0, {x("forward", "compute", 0, 100), x("backward", "compute", 150, 100),
                       x("allreduce", "comm", 50, 70, 2), async("b", 200, 7), async("e", 300, 7),
                       x("checkpoint write", "checkpoint", 260, 30, 3)}));
  write(dir + "/rank1.json",
        trace_file(1, {x("pipeline step", "pipeline", 10, 200), x("F", "compute", 10, 50),
                       x("RF", "comm", 60, 50), x("B", "compute", 110, 50)}));
}

TEST(TraceMerge, MergedFileIsOneTraceWithPidPerRankStartingAtZero) {
  TempDir dir;
  write_crafted(dir.path());
  write(dir.path() + "/notes.txt", "ignored");
  const std::string out = dir.path() + "/timeline.json";
  merge_trace_dir(dir.path(), out);
  const JsonValue merged = read_trace_file(out);  // the file on disk parses as JSON
  std::map<int64_t, int> events_per_pid;
  std::set<std::string> process_names;
  double earliest = 1e300;
  for (const auto& e : merged.at("traceEvents", "t").as_array("t")) {
    const int64_t pid = e.at("pid", "pid").as_int("pid");
    if (e.at("ph", "ph").as_string("ph") == "M") {
      process_names.insert(e.at("args", "a").at("name", "n").as_string("n"));
      continue;
    }
    ++events_per_pid[pid];
    earliest = std::min(earliest, e.at("ts", "ts").as_double("ts"));
  }
  EXPECT_EQ(events_per_pid, (std::map<int64_t, int>{{0, 6}, {1, 4}}));
  EXPECT_EQ(process_names, (std::set<std::string>{"rank 0", "rank 1"}));
  EXPECT_EQ(earliest, 0);
  const auto& other = merged.at("otherData", "o");
  EXPECT_EQ(other.at("origin_us", "o").as_int("o"), kBase);
  ASSERT_EQ(other.at("ranks", "r").as_array("r").size(), 2u);
  EXPECT_EQ(other.at("ranks", "r").as_array("r")[1].at("dropped_events", "d").as_int("d"), 0);
}

TEST(TraceSummary, KnownFractionsPerRankAndOverall) {
  TempDir dir;
  write_crafted(dir.path());
  const TimelineSummary s = summarize(merge_traces(read_rank_traces(dir.path())));
  ASSERT_EQ(s.ranks.size(), 2u);
  const TimeSplit& r0 = s.ranks[0];
  EXPECT_EQ(r0.rank, 0);
  EXPECT_DOUBLE_EQ(r0.wall_us, 300);
  EXPECT_DOUBLE_EQ(r0.compute_us, 200);
  EXPECT_DOUBLE_EQ(r0.comm_us, 170);
  EXPECT_DOUBLE_EQ(r0.overlap_us, 100);
  EXPECT_DOUBLE_EQ(r0.exposed_comm_us, 70);
  EXPECT_DOUBLE_EQ(r0.bubble_us, 0);
  EXPECT_DOUBLE_EQ(r0.checkpoint_us, 30);
  const TimeSplit& r1 = s.ranks[1];
  EXPECT_DOUBLE_EQ(r1.wall_us, 200);
  EXPECT_DOUBLE_EQ(r1.compute_us, 100);
  EXPECT_DOUBLE_EQ(r1.comm_us, 50);
  EXPECT_DOUBLE_EQ(r1.overlap_us, 0);
  EXPECT_DOUBLE_EQ(r1.exposed_comm_us, 50);
  EXPECT_DOUBLE_EQ(r1.bubble_us, 100);
  EXPECT_DOUBLE_EQ(s.overall.wall_us, 500);
  EXPECT_DOUBLE_EQ(s.overall.compute_us, 300);
  EXPECT_DOUBLE_EQ(s.overall.overlap_us, 100);
  const std::string table = format_summary(s);
  EXPECT_NE(table.find("0            0.3    66.7%    56.7%    33.3%    23.3%     0.0%    10.0%    58.8%"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("1            0.2    50.0%    25.0%     0.0%    25.0%    50.0%     0.0%     0.0%"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("all          0.5    60.0%    44.0%    20.0%    24.0%    20.0%     6.0%    45.5%"),
            std::string::npos)
      << table;
}

TEST(TraceSummary, NestedSpansCountOnce) {
  const JsonValue t = parse_json(
      "{\"traceEvents\":[" + x("step", "compute", 0, 100) + "," + x("inner", "compute", 10, 20) +
      "," + x("other thread", "compute", 50, 100, 2) + "]}",
      JsonErrors::kPlain);
  const TimelineSummary s = summarize(t);
  ASSERT_EQ(s.ranks.size(), 1u);
  EXPECT_DOUBLE_EQ(s.ranks[0].compute_us, 150);
  EXPECT_DOUBLE_EQ(s.ranks[0].wall_us, 150);
}

TEST(TraceMerge, ErrorsNameTheProblem) {
  TempDir empty;
  try {
    read_rank_traces(empty.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no rank<R>.json"), std::string::npos) << e.what();
  }
  TempDir broken;
  write(broken.path() + "/rank0.json", "{\"traceEvents\":[{\"ph\":\"X\"");
  try {
    merge_traces(read_rank_traces(broken.path()));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank0.json' is not valid JSON"), std::string::npos)
        << e.what();
  }
  TempDir other;
  write(other.path() + "/rank0.json", "{\"events\":[]}");
  EXPECT_THROW(merge_traces(read_rank_traces(other.path())), Error);
  EXPECT_THROW(summarize(parse_json("[1,2]", JsonErrors::kPlain)), Error);
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

TEST(TraceSvg, LanesPerRankSpansColouredByCategoryWithTooltips) {
  TempDir dir;
  write_crafted(dir.path());
  const JsonValue merged = merge_trace_dir(dir.path(), dir.path() + "/timeline.json");
  const std::string svg = timeline_svg(merged);
  ASSERT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_EQ(count(svg, ">rank 0</text>"), 1u);
  EXPECT_EQ(count(svg, ">rank 1</text>"), 1u);
  EXPECT_EQ(count(svg, "async (bucket reduces)"), 1u);  // only rank 0 has a bucket
  EXPECT_EQ(count(svg, "fill=\"#4e79a7\"><title>"), 4u);  // compute: 2 per rank
  EXPECT_EQ(count(svg, "fill=\"#f28e2b\"><title>"), 3u);  // comm: allreduce, bucket, RF
  EXPECT_EQ(count(svg, "fill=\"#59a14f\"><title>"), 1u);  // checkpoint
  EXPECT_EQ(count(svg, "stroke=\"#edc948\""), 1u);        // pipeline step: an outline
  EXPECT_NE(svg.find("<title>forward — 0.100 ms</title>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("9 spans drawn"), std::string::npos) << svg;

  // A window keeps only what overlaps it; an empty window is an error naming the length.
  SvgOptions window;
  window.from_ms = 0.0;
  window.to_ms = 0.04;  // the first 40 us: forward (rank 0) only, and rank 1 starts at 10 us
  const std::string zoomed = timeline_svg(merged, window);
  EXPECT_EQ(count(zoomed, "fill=\"#4e79a7\"><title>"), 2u) << zoomed;  // forward and F
  window.from_ms = 5;
  window.to_ms = 1;
  try {
    timeline_svg(merged, window);
    FAIL() << "an empty window must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("window 5.0 ms .. 1.0 ms is empty (the timeline lasts 0.300 ms)"),
              std::string::npos)
        << e.what();
  }
}

TEST(TraceSvg, EscapesNamesAndCountsSpansTooNarrowToDraw) {
  TempDir dir;
  write(dir.path() + "/rank0.json",
        trace_file(0, {x("a<b&\\\"c\\\"", "compute", 0, 1000000), x("tiny", "comm", 10, 1, 2)}));
  const std::string svg = timeline_svg(merge_trace_dir(dir.path(), dir.path() + "/t.json"));
  EXPECT_NE(svg.find("a&lt;b&amp;&quot;c&quot;"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  // 1 us of a 1 s timeline on 1400 px is 0.0014 px: left out and counted.
  EXPECT_NE(svg.find("1 spans drawn, 1 narrower than a third of a pixel left out"),
            std::string::npos)
      << svg;
  EXPECT_THROW(timeline_svg(JsonValue()), Error);
}

TEST(LauncherTrace, PrepareRemovesStaleFilesAndExportsTheDirectory) {
  TempDir dir;
  const std::string sub = dir.path() + "/a/b";
  std::vector<std::string> env = {"PATH=/bin", "TANDEM_TRACE_DIR=/old"};
  ASSERT_TRUE(prepare_trace_dir(sub, env));
  EXPECT_EQ(env, (std::vector<std::string>{"PATH=/bin", "TANDEM_TRACE_DIR=" + sub}));
  write(sub + "/rank0.json", "stale");
  write(sub + "/timeline.json", "stale");
  write(sub + "/keep.txt", "mine");
  std::vector<std::string> env2 = {"PATH=/bin"};
  ASSERT_TRUE(prepare_trace_dir(sub, env2));
  EXPECT_EQ(env2.back(), "TANDEM_TRACE_DIR=" + sub);
  EXPECT_FALSE(std::ifstream(sub + "/rank0.json").good());
  EXPECT_FALSE(std::ifstream(sub + "/timeline.json").good());
  EXPECT_TRUE(std::ifstream(sub + "/keep.txt").good());
  // Nothing recorded: a message, no timeline, no exception.
  EXPECT_FALSE(report_trace_dir(sub));
  write_crafted(sub);
  EXPECT_TRUE(report_trace_dir(sub));
  EXPECT_TRUE(std::ifstream(sub + "/timeline.json").good());
}

}  // namespace
}  // namespace tandem::trace
