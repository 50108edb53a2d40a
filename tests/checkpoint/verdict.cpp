// The C++ reader's verdict on checkpoint inputs, which the Python reader's agreement test holds it to
// (tests/checkpoint/test_checkpoint_reader_mutations.py):
//   checkpoint_verdict [--step|--shard|--manifest] PATH...   (a mode applies to the paths after it)
// Prints one line per path, "ok" or "reject <reason>":
//   --step (default): a step directory, with the checks CheckpointManager makes before it restores a
//       step (checkpoint_resume.cpp): read_manifest, a file for rank 0, verify_shard of every file;
//   --shard: a shard file alone (read_shard_header: length prefix, header, size);
//   --manifest: a manifest file alone (parse_manifest: checksum, structure).
// Exits 0 whatever the verdicts; 2 on a usage error.
#include <tandem/base/errors.h>

#include "checkpoint/step_directory.h"

#include <cstdio>
#include <cstring>
#include <string>

namespace {

enum class Mode { kStep, kShard, kManifest };

void check_step(tandem::FileSystem& fs, std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const auto slash = dir.rfind('/');
  const std::string root = slash == std::string::npos ? "." : dir.substr(0, slash);
  const int64_t step = tandem::parse_step_directory_name(dir.substr(slash + 1));
  if (step < 0) throw tandem::CheckpointError("'" + dir + "' is not named step_N");
  const tandem::Manifest m = tandem::detail::read_manifest(fs, root, step);
  if (m.file_of_rank(0) == nullptr) {
    throw tandem::CheckpointError("'" + dir + "/manifest.json' lists no file for rank 0");
  }
  for (const auto& f : m.files) tandem::detail::verify_shard(fs, root, m, f, nullptr);
}

void check_manifest(tandem::FileSystem& fs, const std::string& path) {
  auto f = fs.open_readable(path);
  if (f->size() > tandem::kMaxManifestBytes) throw tandem::CheckpointError("'" + path + "' is too large");
  std::string text(static_cast<size_t>(f->size()), '\0');
  if (!text.empty()) f->read(0, text.size(), text.data());
  tandem::parse_manifest(text);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s [--step|--shard|--manifest] PATH...\n", argv[0]);
    return 2;
  }
  const auto fs = tandem::posix_file_system();
  Mode mode = Mode::kStep;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--step") == 0) mode = Mode::kStep;
    else if (std::strcmp(argv[i], "--shard") == 0) mode = Mode::kShard;
    else if (std::strcmp(argv[i], "--manifest") == 0) mode = Mode::kManifest;
    else {
      std::string verdict = "ok";
      try {
        if (mode == Mode::kStep) check_step(*fs, argv[i]);
        else if (mode == Mode::kShard) tandem::detail::read_shard_header(*fs, argv[i]);
        else check_manifest(*fs, argv[i]);
      } catch (const tandem::CheckpointError& e) {
        verdict = std::string("reject ") + e.what();
        for (char& c : verdict) {
          if (c == '\n') c = ' ';  // one line per path
        }
      }
      std::printf("%s\n", verdict.c_str());
    }
  }
  return 0;
}
