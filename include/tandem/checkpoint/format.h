// The on-disk format of training-state checkpoints (docs/checkpoints.md is the full spec).
//
//   <directory>/step_0000000030/          one committed directory per step
//       manifest.json                     version, step, world size, states, files, checksums
//       rank_00000.safetensors            replicated state + rank 0's own (sharded) state
//       rank_00001.safetensors            rank 1's own state (only ranks that hold unique state)
//
// Shard files are safetensors-compatible: an 8-byte little-endian header length N, N bytes of
// JSON header (padded with spaces to a multiple of 8), then the raw little-endian tensor bytes,
// contiguous and without holes, in header order. The header's "__metadata__" (string -> string)
// carries the format name and version, step, rank, world size, each tensor's XXH3-64
// ("xxh3.<tensor>") and the rank's user values ("value.<name>"), so one shard is readable alone
// (tools/checkpoint_reader.py).
//
// The manifest repeats every tensor record and carries each file's size and XXH3-64 over all of
// its bytes; its own XXH3-64 is embedded (the first member, see encode_manifest). Checksums are
// written as 16 lowercase hex digits, the digits `xxhsum -H3` prints.
//
// This header and its implementation include no torch headers. Every parser here is strict and
// bounds-checked (hostile input throws CheckpointError, never reads out of bounds) and is fuzzed.
// Ownership: plain values (ShardHeader and Manifest own their records); an Xxh3Stream owns its
// XXH3 state.
// Thread-safety: the free functions are reentrant; one Xxh3Stream is used by one thread at a time.
// Errors: parsers and encoders throw CheckpointError saying what is wrong and where (the byte
// offset of malformed JSON, the member of a wrong value, the tensor of a bad offset).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace tandem {

inline constexpr const char* kCheckpointFormatName = "tandem-checkpoint";
inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kManifestFileName = "manifest.json";
// Limits every reader enforces (a header or manifest beyond them is rejected as corrupt).
inline constexpr uint64_t kMaxShardHeaderBytes = 100u << 20;  // safetensors' own limit
inline constexpr uint64_t kMaxManifestBytes = 256u << 20;
inline constexpr size_t kMaxTensorRank = 16;

// safetensors dtype names.
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };
const char* dtype_name(DType dtype);      // "F32", ...
size_t dtype_size(DType dtype);           // bytes per element
DType parse_dtype(const std::string& s);  // throws CheckpointError for unknown names

// A user value saved with the state: step, data-loader position, scalars, strings. Doubles are
// stored by their bits, so they round-trip exactly (NaN and infinities included).
using CheckpointValue = std::variant<int64_t, double, bool, std::string>;
std::string describe_value(const CheckpointValue& v);
// Equality that compares doubles by their bits (NaN == NaN with the same payload).
bool identical(const CheckpointValue& a, const CheckpointValue& b);
bool identical(const std::map<std::string, CheckpointValue>& a,
               const std::map<std::string, CheckpointValue>& b);

// One tensor of a shard file.
struct TensorRecord {
  std::string name;               // "<state>/<key>", e.g. "model/fc1.weight"
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;             // byte offsets in the data section (after the header)
  uint64_t end = 0;
  uint64_t xxh3 = 0;              // XXH3-64 of the tensor's bytes

  uint64_t nbytes() const { return end - begin; }
  bool operator==(const TensorRecord& o) const;
};

struct ShardHeader {
  int64_t step = 0;
  int rank = 0;
  int world_size = 1;
  std::vector<TensorRecord> tensors;            // in data order
  std::map<std::string, CheckpointValue> values;
  // Set by encode/parse: bytes before the data section (8 + JSON length), and data bytes.
  uint64_t header_bytes = 0;
  uint64_t data_bytes = 0;
};

// The bytes that precede a shard's data: length prefix + JSON header (padded to a multiple of 8).
// Assigns each tensor's [begin, end) from its order and nbytes when `assign_offsets`. Sets
// header->header_bytes and data_bytes.
std::string encode_shard_header(ShardHeader* header, bool assign_offsets);

// Reads the 8-byte length prefix; throws when it exceeds kMaxShardHeaderBytes or `file_size` - 8.
uint64_t decode_shard_header_length(const unsigned char prefix[8], uint64_t file_size);

// Parses the JSON header of a shard file of `file_size` bytes (0: do not check the size) and checks
// that the tensors tile the data section exactly (no holes, no overlaps, no overflow, sizes match
// shapes and dtypes, names unique and valid).
ShardHeader parse_shard_header(std::string_view json, uint64_t file_size);

// Which rank's file holds a state, and how many copies exist.
enum class Sharding {
  kReplicated,  // identical on every rank (plain data parallel): written once, by rank 0
  kSharded,     // each rank's own: every rank writes its part to its own file
  kSliced,      // pieces of global tensors ("<global>#<begin>-<end>", see slice_key): every rank
                // writes its pieces to its own file; any world size reads back the pieces it needs
};

// The key of a slice: elements [begin, end) of the flattened global tensor `global`.
std::string slice_key(const std::string& global, int64_t begin, int64_t end);
// Splits a slice key; false when `key` is not one (no '#', or a malformed range).
bool parse_slice_key(const std::string& key, std::string* global, int64_t* begin, int64_t* end);
const char* sharding_name(Sharding s);

struct ManifestState {
  std::string name;   // prefix of its tensor and value names
  std::string kind;   // "module", "optimizer:adamw", "rng", "codec", "tensors", "values", ...
  Sharding sharding = Sharding::kReplicated;
};

struct ManifestFile {
  std::string name;    // "rank_00001.safetensors"
  int rank = 0;
  uint64_t bytes = 0;  // total file size
  uint64_t xxh3 = 0;   // XXH3-64 of all `bytes`
  uint64_t header_bytes = 0;
  std::vector<TensorRecord> tensors;
  std::map<std::string, CheckpointValue> values;
};

struct Manifest {
  int version = kCheckpointFormatVersion;
  int64_t step = 0;
  int world_size = 1;
  std::vector<ManifestState> states;
  std::vector<ManifestFile> files;             // ascending rank, one per rank that wrote state
  std::map<std::string, std::string>
      metadata;  // user metadata (ActivationCheckpointOptions::metadata)

  const ManifestFile* file_of_rank(int rank) const;  // nullptr when that rank wrote nothing
};

// manifest.json's bytes: pretty JSON whose first member is "manifest_xxh3", the XXH3-64 of the
// whole file with those 16 hex digits replaced by '0' characters.
std::string encode_manifest(const Manifest& manifest);
// Verifies the embedded checksum, then parses strictly (version, types, ranges, unique names,
// offsets tiling each file). Throws CheckpointError saying what is wrong.
Manifest parse_manifest(std::string_view text);

// XXH3-64 helpers (libxxhash).
uint64_t xxh3_64(const void* data, size_t n);
std::string hash_hex(uint64_t h);             // 16 lowercase hex digits
uint64_t parse_hash_hex(const std::string& s);  // throws unless exactly 16 hex digits

// Streaming XXH3-64 (over a file written piecewise).
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  void* state_;
};

// "step_0000000030" <-> 30. parse returns -1 unless the name is exactly "step_" + >= 10 digits.
std::string step_directory_name(int64_t step);
int64_t parse_step_directory_name(const std::string& name);
// "rank_00001.safetensors".
std::string shard_file_name(int rank);

// Checks a state, tensor or value name: non-empty, valid UTF-8, at most 4096 bytes, no NUL, not
// "__metadata__". Throws CheckpointError naming `what`.
void check_entry_name(const std::string& name, const std::string& what);

}  // namespace tandem
