// The commit protocol of one checkpoint step, below CheckpointManager and free of torch.
//
//   1. every rank that holds state writes <root>/step_N.tmp/rank_R.safetensors (header with
//      per-tensor XXH3, data), fsyncs it, closes it and fsyncs the staging directory (write_shard);
//   2. once every rank reported success, rank 0 builds the manifest from the shards' headers and
//      sizes (checked against what the ranks reported), writes manifest.json into the staging
//      directory, fsyncs it and the staging directory, renames step_N.tmp to step_N and fsyncs the
//      root directory (commit_step). That rename is the commit point: a directory named exactly
//      step_N containing manifest.json is committed; anything else is not.
// A stale committed step_N (e.g. one found corrupt) is first renamed aside to step_N.old and removed
// after the commit; old steps beyond keep-last-K are renamed to step_M.deleting, then removed.
//
// Readers (verify_shard) check everything against the manifest: file present, size, header
// identical to the manifest's records, every tensor's XXH3 and the file's XXH3; the first mismatch
// throws CheckpointError naming the file and the reason. The file system's own failures pass as
// it throws them (FileError); CheckpointManager hands it a checkpoint_file_system() view, which
// makes them CheckpointErrors too.
//
// Thread-safety: free functions over a FileSystem; concurrent calls for distinct ranks are fine.
#pragma once

#include <tandem/base/file_system.h>
#include <tandem/checkpoint/format.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tandem::detail {

// One tensor to write: contiguous little-endian bytes at `data` (nbytes from dtype and shape).
// `xxh3` may be filled in already (has_xxh3) to skip hashing it again.
struct TensorSource {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t xxh3 = 0;
  bool has_xxh3 = false;
};

struct ShardWriteResult {
  std::string path;
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;          // of the whole file
  uint64_t header_bytes = 0;
};

// Staging and final directory of a step.
std::string staging_directory(const std::string& root, int64_t step);  // <root>/step_N.tmp
std::string step_directory(const std::string& root, int64_t step);     // <root>/step_N

// Hashes every source lacking has_xxh3 (in parallel over tensors, OpenMP).
void hash_sources(std::vector<TensorSource>* sources);

// memcpy of many buffers, split into pieces spread over the OpenMP threads (staging copies).
struct CopyTask {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};
void copy_parallel(const std::vector<CopyTask>& tasks);

// Step 1 for one rank: creates the staging directory if needed, writes, fsyncs and closes the
// shard, fsyncs the staging directory. Tensors are written in the given order.
ShardWriteResult write_shard(FileSystem& fs, const std::string& root, int64_t step, int rank,
                             int world_size, std::vector<TensorSource> tensors,
                             const std::map<std::string, CheckpointValue>& values);

// Reads and parses a shard's header (length prefix + JSON), bounds-checked against its size.
ShardHeader read_shard_header(FileSystem& fs, const std::string& path);

// What each rank reported after step 1.
struct ShardReport {
  int rank = 0;
  bool wrote = false;  // false: this rank holds no unique state and wrote no file
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
  uint64_t header_bytes = 0;
};

// Step 2 (rank 0): reads the reported shards' headers, checks them against the reports, removes
// stray files from the staging directory, writes the manifest and commits the directory.
// Returns the manifest written.
Manifest commit_step(FileSystem& fs, const std::string& root, int64_t step, int world_size,
                     const std::vector<ManifestState>& states,
                     const std::vector<ShardReport>& reports,
                     const std::map<std::string, std::string>& metadata);

// Reads and verifies <dir>/manifest.json (checksum, structure, step matches the name).
Manifest read_manifest(FileSystem& fs, const std::string& root, int64_t step);

// Reads shard `file` of a committed step, verifying it against the step's `manifest`.
// `destination(record)` returns where the tensor's bytes go (record.nbytes() writable bytes), or
// nullptr to read and verify without keeping them. Throws CheckpointError naming the file and
// the reason.
using DestinationFn = std::function<void*(const TensorRecord&)>;
// Every byte is covered without the whole-file checksum, which is not recomputed: the header is
// compared with the manifest's records and values, the tensors must tile the data to the end of
// the file, and each tensor's XXH3 is checked. With `only_destined`, tensors without a
// destination are not read (nor checked).
void verify_shard(FileSystem& fs, const std::string& root, const Manifest& manifest,
                  const ManifestFile& file, const DestinationFn& destination,
                  bool only_destined = false);

// The steps under `root`: committed ones (named step_N and holding manifest.json), newest first,
// and the step-like entries that are not committed with the reason (for warnings).
struct StepListing {
  std::vector<int64_t> committed;
  std::vector<std::pair<std::string, std::string>> uncommitted;  // path, reason
};
StepListing list_steps(FileSystem& fs, const std::string& root);

// Removes committed steps older than the newest `keep_last` (0 keeps all), leftovers of interrupted
// deletions (.deleting, .old), and staging directories of steps older than `newest_committed`.
// Returns the paths removed. The two phases below, one after the other.
std::vector<std::string> remove_old_steps(FileSystem& fs, const std::string& root, int keep_last,
                                          int64_t newest_committed);
// Phase 1, quick: un-commits the steps older than the newest `keep_last` (renamed to .deleting,
// then the root fsynced), so that no listing or resume sees them any more.
void retire_old_steps(FileSystem& fs, const std::string& root, int keep_last);
// Phase 2, the slow part (unlinking the files): removes .deleting and .old directories and
// staging directories of steps older than `newest_committed`. Returns the paths removed.
std::vector<std::string> remove_retired_steps(FileSystem& fs, const std::string& root,
                                              int64_t newest_committed);

}  // namespace tandem::detail
