// Replays the fuzz corpus through the fuzz entry point with the project compiler (no libFuzzer):
//   checkpoint_fuzz_corpus_test DIR...
// Fails (abort or non-zero exit) if any input crashes, throws anything but CheckpointError, or breaks
// a round trip. Also checks that files named reject-* are rejected by every parser (manifests also
// with their checksum made right, so the structural checks behind it are what rejects them).
#include <tandem/base/errors.h>
#include <tandem/checkpoint/format.h>

#include "base/json.h"

#include <dirent.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool accepted_by_any(const std::string& s) {
  try {
    tandem::parse_manifest(s);
    return true;
  } catch (const tandem::CheckpointError&) {
  }
  if (s.size() >= 8) {
    try {
      const uint64_t len =
          tandem::decode_shard_header_length(reinterpret_cast<const unsigned char*>(s.data()), s.size());
      tandem::parse_shard_header(std::string_view(s).substr(8, static_cast<size_t>(len)), s.size());
      return true;
    } catch (const tandem::CheckpointError&) {
    }
  }
  return false;
}

// The manifest with its embedded checksum made right (as the fuzz target does).
std::string fix_manifest_checksum(std::string s) {
  static const char kPrefix[] = "{\n  \"manifest_xxh3\": \"";
  const size_t at = sizeof(kPrefix) - 1;
  if (s.size() < at + 16 || s.compare(0, at, kPrefix) != 0) return s;
  s.replace(at, 16, std::string(16, '0'));
  s.replace(at, 16, tandem::hash_hex(tandem::xxh3_64(s.data(), s.size())));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int files = 0, failures = 0;
  for (int a = 1; a < argc; ++a) {
    DIR* d = opendir(argv[a]);
    if (d == nullptr) {
      std::fprintf(stderr, "checkpoint_fuzz_corpus_test: cannot open %s\n", argv[a]);
      return 2;
    }
    std::vector<std::string> names;
    while (const dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    }
    closedir(d);
    for (const auto& name : names) {
      std::ifstream f(std::string(argv[a]) + "/" + name, std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      const std::string bytes = ss.str();
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++files;
      if (name.rfind("reject-", 0) == 0 && accepted_by_any(bytes)) {
        std::fprintf(stderr, "checkpoint_fuzz_corpus_test: %s was accepted\n", name.c_str());
        ++failures;
      }
      // Structural manifest defects must be caught behind a valid checksum too.
      if (name.rfind("reject-manifest-", 0) == 0 && name != "reject-manifest-bad-checksum.json" &&
          accepted_by_any(fix_manifest_checksum(bytes))) {
        std::fprintf(stderr, "checkpoint_fuzz_corpus_test: %s was accepted with its checksum fixed\n",
                     name.c_str());
        ++failures;
      }
    }
  }
  std::printf("checkpoint_fuzz_corpus_test: %d inputs replayed, %d failures\n", files, failures);
  return failures == 0 && files > 0 ? 0 : 1;
}
