// The flight recorder's ring read from outside the recorder (include/tandem/collectives/
// flight_ring.h), on this process's own memfd through /proc/self/fd: what tandemrun does for a
// stopped worker. Also: a torn record is named, not read; long text is cut with a marker; the
// recorder's own dump and the ring's dump are written by the same code.
#include <tandem/collectives/flight_recorder.h>
#include <tandem/collectives/flight_ring.h>

#include "collectives/flight_ring_layout.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace tandem {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Each test starts from an empty ring of `capacity` and leaves the default one behind.
struct FlightRingTest : ::testing::Test {
  FlightRecorder& recorder = FlightRecorder::instance();
  void SetUp() override { recorder.reset(4, true); }
  void TearDown() override { recorder.reset(2048, true); }
};

TEST_F(FlightRingTest, TheRingOfAProcessIsReadWithoutItsHelp) {
  for (uint64_t i = 0; i < 6; ++i) {
    const uint64_t id =
        recorder.record("[0, 1]", "gloo", "allreduce", i, false, "sum, 4 B float32");
    recorder.started(id);
    if (i < 5) recorder.ended(id, i == 4 ? "peer lost" : "");
  }
  const std::string ring = find_flight_ring(::getpid());
  ASSERT_FALSE(ring.empty()) << "no memfd named tandem-flight-ring among this process's fds";
  const FlightSnapshot s = read_flight_ring(ring);
  EXPECT_EQ(s.pid, ::getpid());
  EXPECT_TRUE(s.torn.empty());
  ASSERT_EQ(s.entries.size(), 4u) << "the ring keeps the last 4 of 6";
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(s.entries[i].id, i + 2);
  EXPECT_EQ(s.entries[0].state, FlightRecorder::State::kCompleted);
  EXPECT_EQ(s.entries[2].state, FlightRecorder::State::kFailed);
  EXPECT_EQ(s.entries[2].error, "peer lost");
  EXPECT_EQ(s.entries[3].state, FlightRecorder::State::kStarted);
  EXPECT_EQ(s.entries[3].group, "[0, 1]");
  EXPECT_EQ(s.entries[3].backend, "gloo");
  EXPECT_EQ(s.entries[3].op, "allreduce");
  EXPECT_EQ(s.entries[3].seq, 5u);
  EXPECT_EQ(s.entries[3].detail, "sum, 4 B float32");
  EXPECT_GT(s.entries[3].started_s, 0);
  EXPECT_EQ(s.entries[3].ended_s, 0);
}

TEST_F(FlightRingTest, TextLongerThanItsFieldIsCutWithAMarker) {
  const std::string detail(300, 'x');
  // A 2-byte character across the cut (byte 316, where "..." begins in the 320-byte field).
  const std::string error = std::string(315, 'e') + "\xc3\xa9" + std::string(10, 'f');
  recorder.ended(recorder.record("[0]", "gloo", "broadcast", 0, false, detail), error);
  const auto entries = recorder.entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].detail, std::string(124, 'x') + "...");
  EXPECT_EQ(entries[0].error, std::string(315, 'e') + "...")
      << "cut before the character, not inside it";
  EXPECT_EQ(entries[0].op, "broadcast");
}

TEST_F(FlightRingTest, ATornRecordIsNamedNotRead) {
  for (uint64_t i = 0; i < 3; ++i) recorder.record("[0, 1]", "gloo", "allreduce", i, false, "sum");
  const std::string ring = find_flight_ring(::getpid());
  ASSERT_FALSE(ring.empty());
  // Another mapping of the same memfd, as a writer stopped halfway through record 1 left it.
  const int fd = ::open(ring.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const size_t bytes = detail::flight_ring_bytes(4);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(mem, MAP_FAILED);
  detail::FlightRingRecord& r =
      detail::flight_ring_records(static_cast<detail::FlightRingHeader*>(mem))[1];
  const uint64_t whole = r.seq.load();
  ASSERT_EQ(whole % 2, 0u);
  r.seq.store(whole + 1);
  std::memcpy(r.op, "half", 5);  // half-written text: must not show up as an op
  const FlightSnapshot s = read_flight_ring(ring);
  r.seq.store(whole);
  std::memcpy(r.op, "allreduce", 10);
  ::munmap(mem, bytes);

  ASSERT_EQ(s.torn.size(), 1u);
  EXPECT_EQ(s.torn[0], 1u);
  ASSERT_EQ(s.entries.size(), 2u);
  EXPECT_EQ(s.entries[0].id, 0u);
  EXPECT_EQ(s.entries[1].id, 2u);
  const std::string path = std::filesystem::temp_directory_path() /
                           ("flight-ring-test-" + std::to_string(::getpid()) + ".json");
  ASSERT_TRUE(write_flight_dump(s, "stopped", path));
  const std::string text = read_text(path);
  std::filesystem::remove(path);
  EXPECT_NE(text.find("\"torn\": [\n  1\n ]"), std::string::npos) << text;
  EXPECT_NE(text.find("\"reason\": \"stopped\""), std::string::npos) << text;
}

TEST_F(FlightRingTest, TheProcessDumpAndTheRingDumpAreOneFormat) {
  recorder.ended(recorder.record("[0, 1]", "gloo", "send", 3, true, "to 1, tag 3"));
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("flight-ring-test-" + std::to_string(::getpid()));
  ::setenv("TANDEM_FLIGHT_RECORDER_DIR", dir.c_str(), 1);
  std::string error;
  const std::string own = recorder.dump("signal", &error);
  ::unsetenv("TANDEM_FLIGHT_RECORDER_DIR");
  ASSERT_FALSE(own.empty()) << error;
  const std::string ring_path = (dir / "from_ring.json").string();
  ASSERT_TRUE(write_flight_dump(read_flight_ring(find_flight_ring(::getpid())), "signal", ring_path,
                                &error))
      << error;
  // Equal but for the moment of the dump.
  const auto without_time = [](std::string t) {
    const auto at = t.find("\"dumped_at\"");
    return at == std::string::npos ? t : t.erase(at, t.find('\n', at) - at);
  };
  const std::string a = read_text(own), b = read_text(ring_path);
  std::filesystem::remove_all(dir);
  EXPECT_NE(a.find("\"op\": \"send\""), std::string::npos) << a;
  EXPECT_EQ(without_time(a), without_time(b));
}

TEST_F(FlightRingTest, OffMeansNoRingAndNoRecord) {
  recorder.reset(4, false);
  EXPECT_EQ(recorder.record("[0]", "gloo", "allreduce", 0, false, ""), UINT64_MAX);
  EXPECT_TRUE(find_flight_ring(::getpid()).empty());
  EXPECT_TRUE(recorder.entries().empty());
}

}  // namespace
}  // namespace tandem
