// tandemrun --trace-dir with two real worker processes training with DistributedDataParallel: the
// merged timeline parses as JSON and holds forward, backward, bucket-reduce and collective spans
// from both ranks; the summary is printed; rank 0 wrote the metrics file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "tests/launcher/tandemrun_process.h"
#include "tools/trace-tools/trace_merge.h"
#include "tools/trace-tools/trace_summary.h"

namespace tandem::trace {
namespace {

using launcher_test::run_tandemrun;
using launcher_test::worker_path;

TEST(TraceProcess, TandemrunMergesBothRanksIntoOneTimeline) {
  char tmpl[] = "/tmp/tandem-trace-process-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string trace_dir = dir + "/trace";
  const std::string metrics = dir + "/metrics.jsonl";
  const auto r = run_tandemrun({"--standalone", "--nproc-per-node", "2", "--trace-dir", trace_dir,
                                worker_path(), "6", metrics},
                               launcher_test::clean_env(), std::chrono::seconds(60));
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("timeline of 2 rank(s) written to " + trace_dir + "/timeline.json"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("tandemrun: all "), std::string::npos) << r.err;  // the summary's last row

  std::ifstream picture(trace_dir + "/timeline.svg");
  std::string svg((std::istreambuf_iterator<char>(picture)), std::istreambuf_iterator<char>());
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u) << "no timeline.svg beside timeline.json";
  EXPECT_NE(svg.find(">rank 1</text>"), std::string::npos);

  const JsonValue merged = read_trace_file(trace_dir + "/timeline.json");
  std::map<int64_t, std::set<std::string>> names;  // pid -> span names (X and async begin)
  std::map<int64_t, std::set<std::string>> categories;
  for (const auto& e : merged.at("traceEvents", "t").as_array("t")) {
    const std::string ph = e.at("ph", "ph").as_string("ph");
    if (ph != "X" && ph != "b") continue;
    const int64_t pid = e.at("pid", "pid").as_int("pid");
    std::string name = e.at("name", "n").as_string("n");
    if (name.rfind("bucket ", 0) == 0) name = "bucket reduce";
    names[pid].insert(name);
    categories[pid].insert(e.at("cat", "c").as_string("c"));
  }
  ASSERT_EQ(names.size(), 2u);
  for (int64_t rank : {0, 1}) {
    for (const char* expected : {"forward", "backward", "bucket reduce", "allreduce", "reduce wait"}) {
      EXPECT_EQ(names[rank].count(expected), 1u) << "rank " << rank << " has no '" << expected << "'";
    }
    EXPECT_EQ(categories[rank].count("compute"), 1u);
    EXPECT_EQ(categories[rank].count("comm"), 1u);
  }
  const TimelineSummary s = summarize(merged);
  ASSERT_EQ(s.ranks.size(), 2u);
  for (const auto& rank : s.ranks) {
    EXPECT_GT(rank.compute_us, 0) << rank.rank;
    EXPECT_GT(rank.comm_us, 0) << rank.rank;
    EXPECT_LE(rank.overlap_us, rank.comm_us) << rank.rank;
  }

  std::ifstream in(metrics);
  int lines = 0;
  for (std::string line; std::getline(in, line);) {
    const JsonValue v = parse_json(line, JsonErrors::kPlain);
    EXPECT_EQ(v.at("step", "s").as_int("s"), 2 * (lines + 1));
    ++lines;
  }
  EXPECT_EQ(lines, 3);  // steps 2, 4, 6 (log_every 2)
  EXPECT_NE(r.out.find("step 6/6 loss"), std::string::npos) << r.out;
  std::system(("rm -rf '" + dir + "'").c_str());
}

TEST(TraceProcess, PipelineActionsBubbleAndCheckpointSpans) {
  char tmpl[] = "/tmp/tandem-trace-pipeline-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string trace_dir = dir + "/trace";
  const auto r = run_tandemrun({"--standalone", "--nproc-per-node", "2", "--trace-dir", trace_dir,
                                worker_path(), "pipeline", dir + "/ckpt"},
                               launcher_test::clean_env(), std::chrono::seconds(60));
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const JsonValue merged = read_trace_file(trace_dir + "/timeline.json");
  std::map<int64_t, std::set<std::string>> names;
  for (const auto& e : merged.at("traceEvents", "t").as_array("t")) {
    if (e.at("ph", "ph").as_string("ph") != "X") continue;
    names[e.at("pid", "pid").as_int("pid")].insert(e.at("name", "n").as_string("n"));
  }
  // Stage 0 on rank 0 sends activations and receives gradients; stage 1 the reverse.
  for (const char* n : {"F", "B", "SEND_F", "RECV_B", "pipeline step", "checkpoint snapshot",
                        "checkpoint write", "checkpoint commit"}) {
    EXPECT_EQ(names[0].count(n), 1u) << "rank 0 has no '" << n << "'";
  }
  for (const char* n : {"F", "B", "RECV_F", "SEND_B", "pipeline step", "checkpoint write"}) {
    EXPECT_EQ(names[1].count(n), 1u) << "rank 1 has no '" << n << "'";
  }
  const TimelineSummary s = summarize(merged);
  ASSERT_EQ(s.ranks.size(), 2u);
  for (const auto& rank : s.ranks) {
    EXPECT_GT(rank.bubble_us, 0) << rank.rank;  // 1F1B with 2 stages always idles
    EXPECT_GT(rank.checkpoint_us, 0) << rank.rank;
  }
  std::system(("rm -rf '" + dir + "'").c_str());
}

}  // namespace
}  // namespace tandem::trace
