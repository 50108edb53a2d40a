// The torch-free layer of training-state checkpoints: strict JSON, shard headers, the manifest and
// its checksum, and the commit protocol under every injected file-system fault.
#include <tandem/base/errors.h>
#include <tandem/checkpoint/format.h>

#include "base/json.h"
#include "checkpoint/step_directory.h"
#include "tests/support/fault_injection_file_system.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <unistd.h>

namespace tandem {
namespace {

using detail::commit_step;
using detail::list_steps;
using detail::read_manifest;
using detail::remove_old_steps;
using detail::ShardReport;
using detail::ShardWriteResult;
using detail::staging_directory;
using detail::step_directory;
using detail::StepListing;
using detail::TensorSource;
using detail::verify_shard;
using detail::write_shard;

std::string temp_dir(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/tandem_ckpt_fmt_" + name + "_" +
                    std::to_string(::getpid());
  posix_file_system()->remove_all(dir);
  posix_file_system()->create_dirs(dir);
  return dir;
}

// ---- JSON ---------------------------------------------------------------------------------

TEST(CheckpointJson, RoundTripsValues) {
  JsonValue o = JsonValue::object();
  o.set("i", int64_t{-9007199254740993});
  o.set("d", 0.1);
  o.set("s", std::string("tab\t\"q\" \xc3\xa9 \x01"));
  o.set("b", true);
  o.set("n", JsonValue());
  JsonValue a = JsonValue::array();
  a.push_back(1);
  a.push_back(JsonValue::object());
  o.set("a", a);
  for (int indent : {-1, 2}) {
    const JsonValue r = parse_json(o.dump(indent), JsonErrors::kCheckpoint);
    EXPECT_EQ(r.at("i", "").as_int(""), int64_t{-9007199254740993});
    EXPECT_EQ(r.at("d", "").as_double(""), 0.1);
    EXPECT_EQ(r.at("s", "").as_string(""), "tab\t\"q\" \xc3\xa9 \x01");
    EXPECT_TRUE(r.at("b", "").as_bool(""));
    EXPECT_TRUE(r.at("n", "").is_null());
    EXPECT_EQ(r.at("a", "").as_array("").size(), 2u);
    EXPECT_EQ(r.dump(indent), o.dump(indent));
  }
}

TEST(CheckpointJson, RejectsEverythingNotStrictJson) {
  const char* bad[] = {
      "", " ", "{", "}", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "'x'", "01", "-", "1.", ".5",
      "1e", "NaN", "Infinity", "-Infinity", "tru", "nul", "[1 2]", "{\"a\":1}x", "\"\\x\"",
      "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"", "\"\x01\"", "\"\xff\"", "\"\xc0\x80\"",
      "\"\xed\xa0\x80\"", "{\"a\":1,\"a\":2}", "1e999", "\"unterminated", "[[[[", "// c\n1",
      "\xef\xbb\xbf{}",
  };
  for (const char* s : bad) {
    EXPECT_THROW(parse_json(s, JsonErrors::kCheckpoint), CheckpointError) << "accepted: " << s;
  }
  std::string deep(100, '[');
  deep += std::string(100, ']');
  EXPECT_THROW(parse_json(deep, JsonErrors::kCheckpoint), CheckpointError);
  JsonLimits small;
  small.max_input_bytes = 4;
  EXPECT_THROW(parse_json("12345", JsonErrors::kCheckpoint, small), CheckpointError);
  EXPECT_EQ(parse_json("99999999999999999999", JsonErrors::kCheckpoint).type(), JsonValue::Type::kDouble);
  EXPECT_EQ(parse_json("\"\\ud83d\\ude00\"", JsonErrors::kCheckpoint).as_string(""), "\xf0\x9f\x98\x80");
}

// ---- shard headers and the manifest -------------------------------------------------------

ShardHeader sample_header() {
  ShardHeader h;
  h.step = 30;
  h.rank = 1;
  h.world_size = 2;
  h.tensors.push_back({"model/w", DType::kF32, {2, 3}, 0, 0, 0x0123456789abcdefULL});
  h.tensors.push_back({"model/empty", DType::kI64, {0, 5}, 0, 0, 0x2d06800538d394c2ULL});
  h.tensors.push_back({"rng/state", DType::kU8, {7}, 0, 0, 42});
  h.values["user/step"] = int64_t{30};
  h.values["user/lr"] = 1e-3;
  h.values["user/nan"] = std::numeric_limits<double>::quiet_NaN();
  h.values["user/name"] = std::string("run \"a\"");
  h.values["user/flag"] = true;
  return h;
}

TEST(CheckpointFormat, ShardHeaderRoundTrip) {
  ShardHeader h = sample_header();
  const std::string prefix = encode_shard_header(&h, true);
  EXPECT_EQ(prefix.size() % 8, 0u);
  EXPECT_EQ(h.header_bytes, prefix.size());
  EXPECT_EQ(h.data_bytes, 24u + 0 + 7);
  const uint64_t file_size = h.header_bytes + h.data_bytes;
  const uint64_t len = decode_shard_header_length(reinterpret_cast<const unsigned char*>(prefix.data()), file_size);
  const ShardHeader r = parse_shard_header(std::string_view(prefix).substr(8, len), file_size);
  EXPECT_EQ(r.step, 30);
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world_size, 2);
  ASSERT_EQ(r.tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(r.tensors[i] == h.tensors[i]) << i;
  EXPECT_EQ(std::get<int64_t>(r.values.at("user/step")), 30);
  EXPECT_EQ(std::get<double>(r.values.at("user/lr")), 1e-3);
  EXPECT_TRUE(std::isnan(std::get<double>(r.values.at("user/nan"))));
  EXPECT_EQ(std::get<std::string>(r.values.at("user/name")), "run \"a\"");
  EXPECT_TRUE(std::get<bool>(r.values.at("user/flag")));
  // Wrong file sizes: truncated or extended.
  EXPECT_THROW(parse_shard_header(std::string_view(prefix).substr(8, len), file_size - 1), CheckpointError);
  EXPECT_THROW(parse_shard_header(std::string_view(prefix).substr(8, len), file_size + 1), CheckpointError);
  EXPECT_THROW(decode_shard_header_length(reinterpret_cast<const unsigned char*>(prefix.data()), 16), CheckpointError);
}

TEST(CheckpointFormat, ShardHeaderRejectsHolesOverlapsAndLies) {
  auto header_with = [](const std::string& tensors) {
    return std::string("{\"__metadata__\":{\"format\":\"tandem-checkpoint\",\"version\":\"1\",\"step\":\"1\","
                       "\"rank\":\"0\",\"world_size\":\"1\",\"xxh3.a/x\":\"0000000000000000\","
                       "\"xxh3.a/y\":\"0000000000000000\"},") + tensors + "}";
  };
  const std::string ok = header_with(
      "\"a/x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"a/y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}");
  EXPECT_NO_THROW(parse_shard_header(ok, 0));
  const std::string bad[] = {
      // hole
      header_with("\"a/x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"a/y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[9,12]}"),
      // overlap
      header_with("\"a/x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"a/y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[7,10]}"),
      // size does not match shape
      header_with("\"a/x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]},"
                  "\"a/y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}"),
      // shape overflow
      header_with("\"a/x\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]},"
                  "\"a/y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}"),
      // negative dimension, unknown dtype, reversed range, missing field, extra field
      header_with("\"a/x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]},"
                  "\"a/y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}"),
      header_with("\"a/x\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                  "\"a/y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}"),
      header_with("\"a/x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]},"
                  "\"a/y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}"),
      header_with("\"a/x\":{\"dtype\":\"F32\",\"shape\":[2]},"
                  "\"a/y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}"),
      header_with("\"a/x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"pickle\":1},"
                  "\"a/y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}"),
      // a tensor without its checksum
      header_with("\"a/x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"),
      // not ours
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
  };
  for (const auto& s : bad) EXPECT_THROW(parse_shard_header(s, 0), CheckpointError) << s;
}

Manifest sample_manifest() {
  Manifest m;
  m.step = 30;
  m.world_size = 2;
  m.states = {{"model", "module", Sharding::kReplicated}, {"rng", "rng", Sharding::kSharded}};
  ManifestFile f;
  f.name = shard_file_name(0);
  f.rank = 0;
  f.header_bytes = 64;
  f.tensors.push_back({"model/w", DType::kF32, {2, 3}, 0, 24, 7});
  f.tensors.push_back({"rng/state", DType::kU8, {8}, 24, 32, 9});
  f.bytes = 64 + 32;
  f.xxh3 = 0xfeedULL;
  f.values["rng/seed"] = int64_t{5};
  m.files.push_back(f);
  m.metadata["run"] = "test";
  return m;
}

TEST(CheckpointFormat, ManifestRoundTripAndChecksum) {
  const Manifest m = sample_manifest();
  const std::string text = encode_manifest(m);
  const Manifest r = parse_manifest(text);
  EXPECT_EQ(r.step, 30);
  EXPECT_EQ(r.world_size, 2);
  ASSERT_EQ(r.files.size(), 1u);
  EXPECT_EQ(r.files[0].xxh3, 0xfeedULL);
  EXPECT_TRUE(r.files[0].tensors[1] == m.files[0].tensors[1]);
  EXPECT_EQ(r.metadata.at("run"), "test");
  EXPECT_EQ(encode_manifest(r), text);  // deterministic
  // Any single flipped bit anywhere is detected.
  for (size_t i = 0; i < text.size(); ++i) {
    std::string t = text;
    t[i] = static_cast<char>(t[i] ^ (1 << (i % 7)));
    EXPECT_THROW(parse_manifest(t), CheckpointError) << "flip at byte " << i;
  }
  // Truncation at any length is detected.
  for (size_t n = 0; n < text.size(); n += 7) {
    EXPECT_THROW(parse_manifest(text.substr(0, n)), CheckpointError) << n;
  }
}

TEST(CheckpointFormat, StepNames) {
  EXPECT_EQ(step_directory_name(30), "step_0000000030");
  EXPECT_EQ(parse_step_directory_name("step_0000000030"), 30);
  EXPECT_EQ(parse_step_directory_name("step_30"), -1);
  EXPECT_EQ(parse_step_directory_name("step_0000000030.tmp"), -1);
  EXPECT_EQ(parse_step_directory_name("step_00000000x0"), -1);
  EXPECT_EQ(shard_file_name(3), "rank_00003.safetensors");
  EXPECT_EQ(hash_hex(xxh3_64("", 0)), "2d06800538d394c2");  // XXH3-64 of nothing, as xxhsum -H3
}

// ---- the commit protocol under faults -----------------------------------------------------

struct Step {
  std::vector<float> data;
  std::vector<uint8_t> more;
};

Step make_step(int64_t step) {
  Step s;
  s.data.resize(3000);
  for (size_t i = 0; i < s.data.size(); ++i) s.data[i] = static_cast<float>(step * 1000 + i);
  s.more.assign(77, static_cast<uint8_t>(step));
  return s;
}

// Saves one step through `fs` like a single-rank CheckpointManager.
void save_step(FileSystem& fs, const std::string& root, int64_t step, const Step& s) {
  std::vector<TensorSource> src(2);
  src[0] = {"m/data", DType::kF32, {static_cast<int64_t>(s.data.size())}, s.data.data()};
  src[1] = {"m/more", DType::kU8, {static_cast<int64_t>(s.more.size())}, s.more.data()};
  const ShardWriteResult w = write_shard(fs, root, step, 0, 1, src, {{"user/step", step}});
  ShardReport rep{0, true, w.bytes, w.xxh3, w.header_bytes};
  commit_step(fs, root, step, 1, {{"m", "tensors", Sharding::kReplicated}, {"user", "values", Sharding::kReplicated}},
              {rep}, {});
  remove_old_steps(fs, root, 2, step);
}

// Returns the newest step that verifies, checking its contents; fails the test if a committed step
// does not verify.
int64_t newest_valid(FileSystem& fs, const std::string& root, std::string* detail) {
  const StepListing l = list_steps(fs, root);
  for (const int64_t step : l.committed) {
    try {
      const Manifest m = read_manifest(fs, root, step);
      Step got;
      got.data.resize(3000);
      got.more.resize(77);
      verify_shard(fs, root, m, m.files.at(0), [&](const TensorRecord& r) -> void* {
        return r.name == "m/data" ? static_cast<void*>(got.data.data()) : got.more.data();
      });
      const Step want = make_step(step);
      EXPECT_EQ(got.data, want.data);
      EXPECT_EQ(got.more, want.more);
      return step;
    } catch (const FileError& e) {
      *detail += std::string("committed step ") + std::to_string(step) + " is invalid: " + e.what() + "\n";
    }
  }
  return -1;
}

TEST(CheckpointProtocol, EveryFaultLeavesPreviousOrNewValid) {
  const std::string root = temp_dir("faults");
  // Count the ops of one save.
  int64_t ops_per_save = 0;
  {
    const std::string dir = root + "/count";
    FaultInjectionFileSystem fs;
    save_step(fs, dir, 10, make_step(10));
    fs.reset();
    save_step(fs, dir, 20, make_step(20));
    ops_per_save = fs.ops();
  }
  ASSERT_GT(ops_per_save, 10);
  enum Mode { kCrash, kCrashPowerLoss, kTorn, kTornPowerLoss, kEnospc, kEio };
  int cases = 0;
  for (int mode = kCrash; mode <= kEio; ++mode) {
    for (int64_t k = 0; k < ops_per_save; ++k) {
      const std::string dir = root + "/m" + std::to_string(mode) + "_" + std::to_string(k);
      auto fs = std::make_shared<FaultInjectionFileSystem>();
      save_step(*fs, dir, 10, make_step(10));  // the previous, valid checkpoint
      fs->reset();
      switch (mode) {
        case kCrash: case kCrashPowerLoss: fs->crash_at(k); break;
        case kTorn: case kTornPowerLoss: fs->torn_write_at(k); break;
        case kEnospc: fs->fail_op(k, ENOSPC); break;
        case kEio: fs->fail_op(k, EIO); break;
      }
      bool threw = false;
      try {
        save_step(*fs, dir, 20, make_step(20));
      } catch (const FileError&) {
        threw = true;
      }
      if (mode == kCrashPowerLoss || mode == kTornPowerLoss) fs->lose_unsynced();
      fs->reset();
      std::string detail;
      const int64_t got = newest_valid(*fs, dir, &detail);
      std::string log;
      for (const auto& l : fs->log()) log += l + "\n";
      EXPECT_TRUE(detail.empty()) << "mode " << mode << " op " << k << ":\n" << detail;
      EXPECT_TRUE(got == 10 || got == 20) << "mode " << mode << " op " << k << " left step " << got;
      if (!threw) {
        EXPECT_EQ(got, 20) << "mode " << mode << " op " << k;
      }
      // After a fault, the next save still works and becomes the newest.
      save_step(*fs, dir, 30, make_step(30));
      detail.clear();
      EXPECT_EQ(newest_valid(*fs, dir, &detail), 30) << "mode " << mode << " op " << k << "\n" << detail;
      ++cases;
      posix_file_system()->remove_all(dir);
    }
  }
  EXPECT_EQ(cases, 6 * ops_per_save);
  posix_file_system()->remove_all(root);
}

TEST(CheckpointProtocol, FsyncFailureNeverCommits) {
  const std::string root = temp_dir("fsync");
  auto fs = std::make_shared<FaultInjectionFileSystem>();
  save_step(*fs, root, 10, make_step(10));
  fs->fail_all(FaultInjectionFileSystem::Op::kSync, EIO);
  EXPECT_THROW(save_step(*fs, root, 20, make_step(20)), FileError);
  fs->reset();
  std::string detail;
  EXPECT_EQ(newest_valid(*fs, root, &detail), 10) << detail;
  fs->fail_all(FaultInjectionFileSystem::Op::kSyncDir, EIO);
  EXPECT_THROW(save_step(*fs, root, 20, make_step(20)), FileError);
  fs->reset();
  // A failed directory fsync after the rename may leave the new step in place; it must be valid.
  const int64_t got = newest_valid(*fs, root, &detail);
  EXPECT_TRUE(got == 10 || got == 20);
  EXPECT_TRUE(detail.empty()) << detail;
  posix_file_system()->remove_all(root);
}

TEST(CheckpointProtocol, CorruptionIsDetectedAndNamed) {
  const std::string root = temp_dir("corrupt");
  auto fs = posix_file_system();
  save_step(*fs, root, 10, make_step(10));
  const Manifest m = read_manifest(*fs, root, 10);
  const std::string shard = step_directory(root, 10) + "/" + shard_file_name(0);
  const std::string original = fs->read_file(shard);
  auto write = [&](const std::string& bytes) {
    auto f = fs->new_writable_file(shard);
    f->append(bytes.data(), bytes.size());
    f->close();
  };
  auto expect_error = [&](const std::string& needle) {
    try {
      verify_shard(*fs, root, m, m.files[0], nullptr);
      ADD_FAILURE() << "no error, expected one mentioning " << needle;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank_00000.safetensors"), std::string::npos) << e.what();
    }
  };
  std::mt19937 rng(1);
  for (int trial = 0; trial < 50; ++trial) {  // single bit flips anywhere in the file
    std::string b = original;
    const size_t at = rng() % b.size();
    b[at] = static_cast<char>(b[at] ^ (1 << (rng() % 8)));
    write(b);
    EXPECT_THROW(verify_shard(*fs, root, m, m.files[0], nullptr), CheckpointError) << "flip at " << at;
  }
  // Every bit of the header: verification does not recompute the whole-file checksum, so the
  // field-by-field comparison with the manifest has to catch each of these on its own.
  const size_t header = static_cast<size_t>(m.files[0].header_bytes);
  ASSERT_LT(header, original.size());
  for (size_t at = 0; at < header; ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string h = original;
      h[at] = static_cast<char>(h[at] ^ (1 << bit));
      write(h);
      EXPECT_THROW(verify_shard(*fs, root, m, m.files[0], nullptr), CheckpointError)
          << "flip of bit " << bit << " at header byte " << at;
    }
  }
  std::string b = original;
  b[b.size() - 5] ^= 1;  // in the data
  write(b);
  expect_error("checksum mismatch");
  write(original.substr(0, original.size() - 100));
  expect_error("truncated");
  write(original + "x");
  expect_error("extended");
  fs->remove_file(shard);
  expect_error("missing");
  write(original);
  EXPECT_NO_THROW(verify_shard(*fs, root, m, m.files[0], nullptr));
  posix_file_system()->remove_all(root);
}

TEST(CheckpointProtocol, ListingSkipsUncommittedAndRetentionKeepsLastK) {
  const std::string root = temp_dir("listing");
  auto fs = posix_file_system();
  for (int64_t s : {10, 20, 30, 40}) save_step(*fs, root, s, make_step(s));
  EXPECT_EQ(list_steps(*fs, root).committed, (std::vector<int64_t>{40, 30}));  // keep_last 2
  fs->create_dirs(staging_directory(root, 50));
  fs->create_dirs(step_directory(root, 60));  // no manifest
  const StepListing l = list_steps(*fs, root);
  EXPECT_EQ(l.committed, (std::vector<int64_t>{40, 30}));
  EXPECT_EQ(l.uncommitted.size(), 2u);
  posix_file_system()->remove_all(root);
}

}  // namespace
}  // namespace tandem
