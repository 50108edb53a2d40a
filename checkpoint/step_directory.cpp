// The per-step commit protocol (checkpoint/step_directory.h). No torch headers.
#include "checkpoint/step_directory.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <sys/mman.h>
#include <unistd.h>

namespace tandem::detail {
namespace {

constexpr size_t kChunk = size_t{8} << 20;  // hash and write in 8 MiB pieces (cache-warm for the write)
// Read and hash in pieces that stay in a core's L2, so the hash reads what the read just wrote.
constexpr size_t kReadChunk = size_t{256} << 10;
constexpr const char* kStagingSuffix = ".tmp";
constexpr const char* kDeletingSuffix = ".deleting";
constexpr const char* kOldSuffix = ".old";

[[noreturn]] void fail(const std::string& what) { throw CheckpointError("tandem: checkpoint: " + what); }

// decode_shard_header_length() with the file named in its error.
uint64_t header_length(const unsigned char prefix[8], uint64_t size, const std::string& path) {
  try {
    return decode_shard_header_length(prefix, size);
  } catch (const CheckpointError& e) {
    fail("'" + path + "': " + std::string(e.what()).substr(std::strlen("tandem: checkpoint: ")));
  }
}

// Maps `n` bytes from `p` writable in one call, on the thread that will read into them: a fresh
// GiB faulted in page by page by the reads cost a third more (trap and lock per 4 KiB page). Pages
// already mapped are left as they are; without MADV_POPULATE_WRITE (Linux < 5.14) the reads fault
// them in as before.
void populate_for_write(void* p, size_t n) {
#ifdef MADV_POPULATE_WRITE
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1);
  if (n > 0) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);  // advice only
#else
  (void)p;
  (void)n;
#endif
}

uint64_t source_nbytes(const TensorSource& s) {
  uint64_t n = dtype_size(s.dtype);
  for (const auto d : s.shape) n *= static_cast<uint64_t>(d);
  return n;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "step_N<suffix>" -> N, or -1.
int64_t parse_suffixed(const std::string& name, const std::string& suffix) {
  if (!ends_with(name, suffix)) return -1;
  return parse_step_directory_name(name.substr(0, name.size() - suffix.size()));
}

// mkdir -p that also makes each new directory's entry durable (fsync of its parent), so a power
// loss cannot take the checkpoint root away after a commit.
void ensure_durable_directory(FileSystem& fs, const std::string& path) {
  if (path.empty() || path == "." || path == "/" || fs.is_directory(path)) return;
  const std::string parent = parent_path(path);
  if (parent != path) ensure_durable_directory(fs, parent);
  fs.create_dirs(path);
  fs.sync_dir(parent);
}

}  // namespace

std::string staging_directory(const std::string& root, int64_t step) {
  return join_path(root, step_directory_name(step) + kStagingSuffix);
}

std::string step_directory(const std::string& root, int64_t step) {
  return join_path(root, step_directory_name(step));
}

void hash_sources(std::vector<TensorSource>* sources) {
  auto& s = *sources;
  const int64_t n = static_cast<int64_t>(s.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    if (!s[i].has_xxh3) {
      s[i].xxh3 = xxh3_64(s[i].data, source_nbytes(s[i]));
      s[i].has_xxh3 = true;
    }
  }
}

void copy_parallel(const std::vector<CopyTask>& tasks) {
  constexpr size_t kPiece = size_t{4} << 20;
  std::vector<CopyTask> pieces;
  for (const auto& t : tasks) {
    for (size_t off = 0; off < t.bytes; off += kPiece) {
      pieces.push_back({static_cast<char*>(t.dst) + off, static_cast<const char*>(t.src) + off,
                        std::min(kPiece, t.bytes - off)});
    }
  }
  const int64_t n = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const auto& p = pieces[static_cast<size_t>(i)];
    std::memcpy(p.dst, p.src, p.bytes);
  }
}

ShardWriteResult write_shard(FileSystem& fs, const std::string& root, int64_t step, int rank,
                             int world_size, std::vector<TensorSource> tensors,
                             const std::map<std::string, CheckpointValue>& values) {
  hash_sources(&tensors);
  ShardHeader header;
  header.step = step;
  header.rank = rank;
  header.world_size = world_size;
  header.values = values;
  for (const auto& t : tensors) {
    TensorRecord r;
    r.name = t.name;
    r.dtype = t.dtype;
    r.shape = t.shape;
    r.xxh3 = t.xxh3;
    header.tensors.push_back(std::move(r));
  }
  const std::string prefix = encode_shard_header(&header, /*assign_offsets=*/true);

  const std::string dir = staging_directory(root, step);
  ensure_durable_directory(fs, root);
  fs.create_dirs(dir);  // made durable by the commit's fsync of the root
  ShardWriteResult result;
  result.path = join_path(dir, shard_file_name(rank));
  Xxh3Stream file_hash;
  auto f = fs.new_writable_file(result.path);
  file_hash.update(prefix.data(), prefix.size());
  f->append(prefix.data(), prefix.size());
  for (const auto& t : tensors) {
    const char* p = static_cast<const char*>(t.data);
    uint64_t left = source_nbytes(t);
    while (left > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kChunk));
      file_hash.update(p, n);
      f->append(p, n);
      p += n;
      left -= n;
    }
  }
  f->sync();
  f->close();
  fs.sync_dir(dir);
  result.bytes = header.header_bytes + header.data_bytes;
  result.xxh3 = file_hash.digest();
  result.header_bytes = header.header_bytes;
  return result;
}

ShardHeader read_shard_header(FileSystem& fs, const std::string& path) {
  auto f = fs.open_readable(path);
  const uint64_t size = f->size();
  if (size < 8) fail("'" + path + "' is " + std::to_string(size) + " bytes, too short for a shard header (truncated)");
  unsigned char prefix[8];
  f->read(0, 8, prefix);
  const uint64_t len = header_length(prefix, size, path);
  std::string json(static_cast<size_t>(len), '\0');
  if (len > 0) f->read(8, json.size(), json.data());
  try {
    return parse_shard_header(json, size);
  } catch (const CheckpointError& e) {
    fail("'" + path + "': " + std::string(e.what()).substr(std::strlen("tandem: checkpoint: ")));
  }
}

Manifest commit_step(FileSystem& fs, const std::string& root, int64_t step, int world_size,
                     const std::vector<ManifestState>& states,
                     const std::vector<ShardReport>& reports,
                     const std::map<std::string, std::string>& metadata) {
  const std::string staging = staging_directory(root, step);
  Manifest m;
  m.step = step;
  m.world_size = world_size;
  m.states = states;
  m.metadata = metadata;
  std::set<std::string> listed;
  for (const auto& r : reports) {
    if (!r.wrote) continue;
    const std::string path = join_path(staging, shard_file_name(r.rank));
    const ShardHeader h = read_shard_header(fs, path);
    if (h.step != step || h.rank != r.rank || h.world_size != world_size) {
      fail("'" + path + "' belongs to step " + std::to_string(h.step) + " rank " +
           std::to_string(h.rank) + "/" + std::to_string(h.world_size) + ", expected step " +
           std::to_string(step) + " rank " + std::to_string(r.rank) + "/" + std::to_string(world_size) +
           "; not committing");
    }
    if (h.header_bytes + h.data_bytes != r.bytes || h.header_bytes != r.header_bytes) {
      fail("'" + path + "' holds " + std::to_string(h.header_bytes + h.data_bytes) +
           " bytes but rank " + std::to_string(r.rank) + " reported writing " +
           std::to_string(r.bytes) + "; not committing");
    }
    ManifestFile mf;
    mf.name = shard_file_name(r.rank);
    mf.rank = r.rank;
    mf.bytes = r.bytes;
    mf.xxh3 = r.xxh3;
    mf.header_bytes = r.header_bytes;
    mf.tensors = h.tensors;
    mf.values = h.values;
    m.files.push_back(std::move(mf));
    listed.insert(shard_file_name(r.rank));
  }
  std::sort(m.files.begin(), m.files.end(),
            [](const ManifestFile& a, const ManifestFile& b) { return a.rank < b.rank; });
  // Files of an earlier, interrupted attempt at this step (e.g. a larger world) are not part of it.
  for (const auto& name : fs.list_dir(staging)) {
    if (listed.count(name) == 0) fs.remove_all(join_path(staging, name));
  }
  const std::string text = encode_manifest(m);
  {
    auto f = fs.new_writable_file(join_path(staging, kManifestFileName));
    f->append(text.data(), text.size());
    f->sync();
    f->close();
  }
  fs.sync_dir(staging);
  const std::string final_dir = step_directory(root, step);
  const std::string old = final_dir + kOldSuffix;
  const bool replace = fs.exists(final_dir);
  if (replace) {
    if (fs.exists(old)) fs.remove_all(old);
    fs.rename(final_dir, old);
  }
  fs.rename(staging, final_dir);  // the commit point (durable after the next line)
  fs.sync_dir(root);
  if (replace) fs.remove_all(old);
  return m;
}

Manifest read_manifest(FileSystem& fs, const std::string& root, int64_t step) {
  const std::string path = join_path(step_directory(root, step), kManifestFileName);
  std::string text;
  {
    auto f = fs.open_readable(path);
    if (f->size() > kMaxManifestBytes) fail("'" + path + "' is larger than the manifest limit");
    text.resize(static_cast<size_t>(f->size()));
    if (!text.empty()) f->read(0, text.size(), text.data());
  }
  Manifest m;
  try {
    m = parse_manifest(text);
  } catch (const CheckpointError& e) {
    fail("'" + path + "': " + std::string(e.what()).substr(std::strlen("tandem: checkpoint: ")));
  }
  if (m.step != step) {
    fail("'" + path + "' says step " + std::to_string(m.step) + " but lives in " +
         step_directory_name(step));
  }
  return m;
}

void verify_shard(FileSystem& fs, const std::string& root, const Manifest& manifest,
                  const ManifestFile& file, const DestinationFn& destination, bool only_destined) {
  const int64_t step = manifest.step;
  const std::string path = join_path(step_directory(root, step), file.name);
  if (!fs.exists(path)) fail("'" + path + "' is missing");
  auto f = fs.open_readable(path);
  if (f->size() != file.bytes) {
    fail("'" + path + "' is " + std::to_string(f->size()) + " bytes, the manifest says " +
         std::to_string(file.bytes) + (f->size() < file.bytes ? " (truncated)" : " (extended)"));
  }
  // Header: parsed, and identical to the manifest's records.
  unsigned char prefix[8];
  f->read(0, 8, prefix);
  const uint64_t len = header_length(prefix, f->size(), path);
  if (8 + len != file.header_bytes) {
    fail("'" + path + "' header is " + std::to_string(8 + len) + " bytes, the manifest says " +
         std::to_string(file.header_bytes));
  }
  std::string head(8 + static_cast<size_t>(len), '\0');
  std::memcpy(head.data(), prefix, 8);
  if (len > 0) f->read(8, static_cast<size_t>(len), head.data() + 8);
  ShardHeader h;
  try {
    h = parse_shard_header(std::string_view(head).substr(8), f->size());
  } catch (const CheckpointError& e) {
    fail("'" + path + "': " + std::string(e.what()).substr(std::strlen("tandem: checkpoint: ")));
  }
  if (h.step != step || h.rank != file.rank || h.world_size != manifest.world_size) {
    fail("'" + path + "' header says step " + std::to_string(h.step) + " rank " +
         std::to_string(h.rank) + " of " + std::to_string(h.world_size) +
         ", the manifest says step " + std::to_string(step) + " rank " +
         std::to_string(file.rank) + " of " + std::to_string(manifest.world_size));
  }
  if (h.tensors.size() != file.tensors.size()) {
    fail("'" + path + "' header lists " + std::to_string(h.tensors.size()) +
         " tensors, the manifest " + std::to_string(file.tensors.size()));
  }
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    if (!(h.tensors[i] == file.tensors[i])) {
      fail("'" + path + "' header entry \"" + h.tensors[i].name +
           "\" differs from the manifest's record of \"" + file.tensors[i].name + "\"");
    }
  }
  if (!identical(h.values, file.values)) fail("'" + path + "' header values differ from the manifest's");

  // Data: read each tensor (in parallel over tensors) and hash it. The whole-file hash is not
  // recomputed: it would be a second pass over every byte, and it adds nothing here. The header
  // was compared with the manifest field by field, parse_shard_header() checked that the tensors
  // tile the data to the end of the file, and each tensor's bytes are checked below.
  const auto& recs = file.tensors;
  const int64_t n = static_cast<int64_t>(recs.size());
  std::vector<void*> dst(recs.size());
  std::vector<std::string> scratch(recs.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    dst[i] = destination ? destination(recs[i]) : nullptr;
    if (dst[i] == nullptr && !only_destined) {
      scratch[i].resize(static_cast<size_t>(recs[i].nbytes()));
      dst[i] = scratch[i].data();
    }
  }
  std::vector<uint64_t> got(recs.size());
  std::vector<std::string> errors(recs.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    try {
      const auto& r = recs[static_cast<size_t>(i)];
      const size_t nbytes = static_cast<size_t>(r.nbytes());
      char* p = static_cast<char*>(dst[static_cast<size_t>(i)]);
      if (p == nullptr) continue;  // only_destined: not wanted, not read
      Xxh3Stream th;
      populate_for_write(p, nbytes);
      for (size_t off = 0; off < nbytes; off += kReadChunk) {
        const size_t m = std::min(kReadChunk, nbytes - off);
        f->read(file.header_bytes + r.begin + off, m, p + off);
        th.update(p + off, m);
      }
      got[static_cast<size_t>(i)] = th.digest();
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(i)] = e.what();
    }
  }
  for (size_t i = 0; i < recs.size(); ++i) {
    if (!errors[i].empty()) fail("'" + path + "': reading tensor \"" + recs[i].name + "\": " + errors[i]);
    if (dst[i] == nullptr) continue;
    if (got[i] != recs[i].xxh3) {
      fail("'" + path + "': tensor \"" + recs[i].name + "\" checksum mismatch (stored " +
           hash_hex(recs[i].xxh3) + ", computed " + hash_hex(got[i]) + "): the data is corrupt");
    }
  }
}

StepListing list_steps(FileSystem& fs, const std::string& root) {
  StepListing out;
  if (!fs.is_directory(root)) return out;
  for (const auto& name : fs.list_dir(root)) {
    const std::string path = join_path(root, name);
    const int64_t step = parse_step_directory_name(name);
    if (step >= 0) {
      if (!fs.is_directory(path)) {
        out.uncommitted.emplace_back(path, "not a directory");
      } else if (!fs.exists(join_path(path, kManifestFileName))) {
        out.uncommitted.emplace_back(path, "no manifest.json (never committed)");
      } else {
        out.committed.push_back(step);
      }
    } else if (parse_suffixed(name, kStagingSuffix) >= 0) {
      out.uncommitted.emplace_back(path, "staging directory of an interrupted or unfinished save (never committed)");
    }
  }
  std::sort(out.committed.rbegin(), out.committed.rend());
  return out;
}

std::vector<std::string> remove_old_steps(FileSystem& fs, const std::string& root, int keep_last,
                                          int64_t newest_committed) {
  retire_old_steps(fs, root, keep_last);
  return remove_retired_steps(fs, root, newest_committed);
}

void retire_old_steps(FileSystem& fs, const std::string& root, int keep_last) {
  if (!fs.is_directory(root)) return;
  const StepListing listing = list_steps(fs, root);
  bool renamed = false;
  if (keep_last > 0) {
    for (size_t i = static_cast<size_t>(keep_last); i < listing.committed.size(); ++i) {
      const std::string dir = step_directory(root, listing.committed[i]);
      const std::string trash = dir + kDeletingSuffix;
      if (fs.exists(trash)) fs.remove_all(trash);
      fs.rename(dir, trash);  // un-commit first, so a crash mid-removal leaves nothing half-valid
      renamed = true;
    }
  }
  if (renamed) fs.sync_dir(root);
}

std::vector<std::string> remove_retired_steps(FileSystem& fs, const std::string& root,
                                              int64_t newest_committed) {
  std::vector<std::string> removed;
  if (!fs.is_directory(root)) return removed;
  for (const auto& name : fs.list_dir(root)) {
    const std::string path = join_path(root, name);
    const int64_t staged = parse_suffixed(name, kStagingSuffix);
    if (parse_suffixed(name, kDeletingSuffix) >= 0 || parse_suffixed(name, kOldSuffix) >= 0 ||
        (staged >= 0 && staged < newest_committed)) {
      fs.remove_all(path);
      removed.push_back(path);
    }
  }
  return removed;
}

}  // namespace tandem::detail
