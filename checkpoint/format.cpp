// The checkpoint format's vocabulary: dtypes, values, entry names, XXH3 helpers, file and
// directory names (see include/tandem/checkpoint/format.h). Shard headers are in shard_header.cpp,
// the manifest in manifest.cpp. No torch headers.
#include <tandem/checkpoint/format.h>

#include <tandem/base/errors.h>

#include "base/json.h"
#include "checkpoint/tensor_records.h"

#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <limits>

namespace tandem {

using detail::corrupt;

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF64: return "F64";
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: return 2;
    case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  return 1;
}

DType parse_dtype(const std::string& s) {
  static const std::pair<const char*, DType> kAll[] = {
      {"F64", DType::kF64}, {"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16},
      {"I64", DType::kI64}, {"I32", DType::kI32}, {"I16", DType::kI16}, {"I8", DType::kI8},
      {"U8", DType::kU8},   {"BOOL", DType::kBool}};
  for (const auto& [name, d] : kAll) {
    if (s == name) return d;
  }
  corrupt("unknown dtype \"" + s.substr(0, 32) +
          "\"; tandem reads F64, F32, F16, BF16, I64, I32, I16, I8, U8 and BOOL");
}

std::string describe_value(const CheckpointValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return "int " + std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "float %.17g", *d);
    return buf;
  }
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "bool true" : "bool false";
  return "string \"" + std::get<std::string>(v) + "\"";
}

bool identical(const CheckpointValue& a, const CheckpointValue& b) {
  if (a.index() != b.index()) return false;
  if (const auto* d = std::get_if<double>(&a)) return detail::double_bits(*d) == detail::double_bits(std::get<double>(b));
  return a == b;
}

bool identical(const std::map<std::string, CheckpointValue>& a,
               const std::map<std::string, CheckpointValue>& b) {
  if (a.size() != b.size()) return false;
  for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j) {
    if (i->first != j->first || !identical(i->second, j->second)) return false;
  }
  return true;
}

bool TensorRecord::operator==(const TensorRecord& o) const {
  return name == o.name && dtype == o.dtype && shape == o.shape && begin == o.begin &&
         end == o.end && xxh3 == o.xxh3;
}

void check_entry_name(const std::string& name, const std::string& what) {
  if (name.empty()) throw CheckpointError("tandem: checkpoint: " + what + " is empty.");
  if (name.size() > 4096) {
    throw CheckpointError("tandem: checkpoint: " + what + " is " + std::to_string(name.size()) +
                          " bytes long; at most 4096 are allowed.");
  }
  if (name.find('\0') != std::string::npos || !is_valid_utf8(name)) {
    throw CheckpointError("tandem: checkpoint: " + what + " \"" + name +
                          "\" must be UTF-8 text without NUL bytes.");
  }
  if (name == "__metadata__") {
    throw CheckpointError("tandem: checkpoint: " + what + " may not be \"__metadata__\".");
  }
}

uint64_t xxh3_64(const void* data, size_t n) { return XXH3_64bits(data, n); }

std::string hash_hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
  return buf;
}

uint64_t parse_hash_hex(const std::string& s) {
  if (s.size() != 16) corrupt("checksum \"" + s.substr(0, 32) + "\" is not 16 hex digits");
  uint64_t v = 0;
  for (const char c : s) {
    v <<= 4;
    if (c >= '0' && c <= '9') v |= static_cast<uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f') v |= static_cast<uint64_t>(c - 'a' + 10);
    else corrupt("checksum \"" + s + "\" is not 16 lowercase hex digits");
  }
  return v;
}

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw CheckpointError("tandem: checkpoint: out of memory creating an XXH3 state.");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3Stream::update(const void* data, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, n);
}

uint64_t Xxh3Stream::digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

std::string step_directory_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step_%010" PRId64, step);
  return buf;
}

int64_t parse_step_directory_name(const std::string& name) {
  if (name.size() < 15 || name.size() > 24 || name.compare(0, 5, "step_") != 0) return -1;
  uint64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / 10)) return -1;
  }
  return static_cast<int64_t>(v);
}

std::string shard_file_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank_%05d.safetensors", rank);
  return buf;
}

std::string slice_key(const std::string& global, int64_t begin, int64_t end) {
  return global + "#" + std::to_string(begin) + "-" + std::to_string(end);
}

bool parse_slice_key(const std::string& key, std::string* global, int64_t* begin, int64_t* end) {
  const auto hash = key.rfind('#');
  if (hash == std::string::npos) return false;
  const std::string range = key.substr(hash + 1);
  const auto dash = range.find('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 == range.size()) return false;
  for (size_t i = 0; i < range.size(); ++i) {
    if (i != dash && (range[i] < '0' || range[i] > '9')) return false;
  }
  if (dash > 18 || range.size() - dash - 1 > 18) return false;  // fits int64
  *global = key.substr(0, hash);
  *begin = std::stoll(range.substr(0, dash));
  *end = std::stoll(range.substr(dash + 1));
  return *begin <= *end;
}

}  // namespace tandem
