// Worker output reaches tandemrun's stdout/stderr line by line with a "[rank R]: " prefix.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <string>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher_test {
namespace {

TEST(OutputPrefixTest, StdoutAndStderrLinesArePrefixedAndPartialLinesFlushed) {
  const RunResult r = run_tandemrun({"--nproc-per-node", "2", worker_path(), "print"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::string p = "[rank " + std::to_string(rank) + "]: ";
    EXPECT_NE(r.out.find(p + "out line 1\n" + p + "out line 2\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(p + "\n"), std::string::npos) << "an empty line keeps its prefix";
    EXPECT_NE(r.out.find(p + std::string(10000, 'x') + "\n"), std::string::npos)
        << "a long line stays whole";
    // The partial last line is flushed (with a newline added) when the worker exits.
    EXPECT_NE(r.out.find(p + "partial-out-" + std::to_string(rank) + "\n"), std::string::npos)
        << r.out;
    EXPECT_NE(r.err.find(p + "err line 1\n"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(p + "partial-err-" + std::to_string(rank) + "\n"), std::string::npos)
        << r.err;
  }
  // Each stream goes to its own side.
  EXPECT_EQ(r.out.find("err line"), std::string::npos);
  EXPECT_EQ(r.out.find("partial-err"), std::string::npos);
  EXPECT_EQ(r.err.find("out line"), std::string::npos);
  EXPECT_EQ(r.err.find("partial-out"), std::string::npos);
  for (const auto& line : split_lines(r.out))
    EXPECT_EQ(line.rfind("[rank ", 0), 0u) << "unprefixed: " << line;
}

TEST(OutputPrefixTest, ManyLinesFromManyWorkersNeverMixWithinALine) {
  constexpr int kLines = 2000;
  const RunResult r =
      run_tandemrun({"--nproc-per-node", "3", worker_path(), "flood", std::to_string(kLines)});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& [text, stream] : {std::pair{&r.out, "out"}, std::pair{&r.err, "err"}}) {
    SCOPED_TRACE(stream);
    const std::regex line_re(std::string(R"(^\[rank (\d)\]: rank (\d) )") + stream + R"( (\d+)$)");
    std::map<int, int> next;  // rank -> next expected line number
    for (const auto& line : split_lines(*text)) {
      if (line.rfind("tandemrun: ", 0) == 0) continue;  // the OMP_NUM_THREADS notice on stderr
      std::smatch m;
      ASSERT_TRUE(std::regex_match(line, m, line_re)) << "malformed line: " << line;
      ASSERT_EQ(m[1], m[2]) << line;
      const int rank = std::stoi(m[1]);
      ASSERT_EQ(std::stoi(m[3]), next[rank]) << "lines of one worker stay in order";
      ++next[rank];
    }
    ASSERT_EQ(next.size(), 3u);
    for (const auto& [rank, count] : next) EXPECT_EQ(count, kLines) << "rank " << rank;
  }
}

TEST(OutputPrefixTest, ProgramArgumentsArePassedThroughUntouched) {
  const RunResult r = run_tandemrun({"--nproc-per-node", "1", worker_path(), "args",
                                     "--nproc-per-node", "5", "-x", "--help", "a b"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "[rank 0]: arg[0]=--nproc-per-node\n[rank 0]: arg[1]=5\n[rank 0]: arg[2]=-x\n"
            "[rank 0]: arg[3]=--help\n[rank 0]: arg[4]=a b\n");
}

TEST(OutputPrefixTest, DoubleDashBeforeProgramIsAccepted) {
  const RunResult r = run_tandemrun({"--nproc-per-node", "1", "--", worker_path(), "args", "z"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0]: arg[0]=z\n");
}

}  // namespace
}  // namespace tandem::launcher_test
