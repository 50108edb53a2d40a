// Fuzz target for everything that parses checkpoint bytes: the strict JSON reader, the shard
// header parser (8-byte length + JSON, bounds-checked against the file size) and the manifest
// parser. Built two ways:
//   - with clang and libFuzzer (+ASan/UBSan) by scripts/fuzz-checkpoint, never by the default build;
//   - with the project compiler into checkpoint_fuzz_corpus_test (corpus_main.cpp), which replays
//     tests/checkpoint/fuzz/corpus/ in CI.
// Contract checked: hostile input either parses or throws CheckpointError; anything else (another
// exception, a crash, an out-of-bounds read, a parse/encode round trip that changes) aborts.
#include <tandem/base/errors.h>
#include <tandem/checkpoint/format.h>

#include "base/json.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace {

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "checkpoint_parser_fuzz: %s\n", what);
  std::abort();
}

void fuzz_json(std::string_view s) {
  try {
    const tandem::JsonValue v = tandem::parse_json(s, tandem::JsonErrors::kCheckpoint);
    const std::string compact = v.dump();
    const std::string pretty = v.dump(2);
    if (tandem::parse_json(compact, tandem::JsonErrors::kCheckpoint).dump() != compact) bug("JSON compact round trip changed");
    if (tandem::parse_json(pretty, tandem::JsonErrors::kCheckpoint).dump() != compact) bug("JSON pretty round trip changed");
  } catch (const tandem::CheckpointError&) {
  }
}

void fuzz_shard(std::string_view s) {
  if (s.size() < 8) return;
  tandem::ShardHeader h;
  try {
    const uint64_t len =
        tandem::decode_shard_header_length(reinterpret_cast<const unsigned char*>(s.data()), s.size());
    h = tandem::parse_shard_header(s.substr(8, static_cast<size_t>(len)), s.size());
  } catch (const tandem::CheckpointError&) {
    return;
  }
  // Accepted: it must survive a round trip unchanged.
  tandem::ShardHeader copy = h;
  const std::string prefix = tandem::encode_shard_header(&copy, /*assign_offsets=*/false);
  const tandem::ShardHeader again = tandem::parse_shard_header(std::string_view(prefix).substr(8), 0);
  if (again.tensors.size() != h.tensors.size() || !tandem::identical(again.values, h.values) ||
      again.step != h.step || again.rank != h.rank || again.world_size != h.world_size) {
    bug("shard header round trip changed");
  }
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    if (!(again.tensors[i] == h.tensors[i])) bug("shard tensor record round trip changed");
  }
}

void fuzz_manifest(std::string_view s) {
  // As is (the checksum almost always rejects it) ...
  try {
    tandem::parse_manifest(s);
  } catch (const tandem::CheckpointError&) {
  }
  // ... and with the embedded checksum made right, so the structural checks behind it get fuzzed.
  static const char kPrefix[] = "{\n  \"manifest_xxh3\": \"";
  const size_t at = sizeof(kPrefix) - 1;
  if (s.size() < at + 16 || s.compare(0, at, kPrefix) != 0) return;
  std::string fixed(s);
  fixed.replace(at, 16, std::string(16, '0'));
  fixed.replace(at, 16, tandem::hash_hex(tandem::xxh3_64(fixed.data(), fixed.size())));
  tandem::Manifest m;
  try {
    m = tandem::parse_manifest(fixed);
  } catch (const tandem::CheckpointError&) {
    return;
  }
  const std::string text = tandem::encode_manifest(m);
  if (tandem::encode_manifest(tandem::parse_manifest(text)) != text) bug("manifest round trip changed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  try {
    fuzz_json(s);
    fuzz_shard(s);
    fuzz_manifest(s);
  } catch (const tandem::CheckpointError& e) {
    // Only the round-trip re-parse of accepted input may get here: that is a bug too.
    std::fprintf(stderr, "checkpoint_parser_fuzz: accepted input failed its round trip: %s\n", e.what());
    std::abort();
  }
  return 0;
}
