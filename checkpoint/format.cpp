// Checkpoint format: shard headers, manifest, XXH3 (see include/tandem/checkpoint/format.h).
// No torch headers.
#include <tandem/checkpoint/format.h>

#include <tandem/base/errors.h>

#include "base/json.h"

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

namespace tandem {
namespace {

[[noreturn]] void corrupt(const std::string& what) {
  throw CheckpointError("tandem: checkpoint: " + what);
}

constexpr const char* kValuePrefix = "value.";
constexpr const char* kHashPrefix = "xxh3.";

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& what) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) corrupt(what + ": size overflows");
  return a * b;
}

uint64_t double_bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

double bits_double(uint64_t b) {
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
}

// Shard-header value encoding (a string): "int:30", "float:3f50624dd2f1a9fc" (IEEE bits),
// "bool:true", "str:<utf-8>".
std::string encode_value_string(const CheckpointValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return "int:" + std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return "float:" + hash_hex(double_bits(*d));
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "bool:true" : "bool:false";
  return "str:" + std::get<std::string>(v);
}

int64_t parse_int_strict(const std::string& s, const std::string& what) {
  if (s.empty() || s.size() > 20) corrupt(what + " is not an integer: \"" + s + "\"");
  size_t i = 0;
  bool neg = false;
  if (s[0] == '-') {
    neg = true;
    i = 1;
    if (s.size() == 1) corrupt(what + " is not an integer: \"" + s + "\"");
  }
  if (s.size() - i > 1 && s[i] == '0') corrupt(what + " has a leading zero: \"" + s + "\"");
  uint64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') corrupt(what + " is not an integer: \"" + s + "\"");
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) corrupt(what + " overflows");
    v = v * 10 + d;
  }
  const uint64_t lim = neg ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  if (v > lim) corrupt(what + " overflows int64");
  return neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
}

CheckpointValue decode_value_string(const std::string& s, const std::string& what) {
  if (s.rfind("int:", 0) == 0) return parse_int_strict(s.substr(4), what);
  if (s.rfind("float:", 0) == 0) return bits_double(parse_hash_hex(s.substr(6)));
  if (s == "bool:true") return true;
  if (s == "bool:false") return false;
  if (s.rfind("str:", 0) == 0) return s.substr(4);
  corrupt(what + " has an unknown value encoding: \"" + s.substr(0, 32) + "\"");
}

JsonValue value_to_json(const CheckpointValue& v) {
  JsonValue o = JsonValue::object();
  if (const auto* i = std::get_if<int64_t>(&v)) {
    o.set("type", "int");
    o.set("value", *i);
  } else if (const auto* d = std::get_if<double>(&v)) {
    o.set("type", "float");
    o.set("bits", hash_hex(double_bits(*d)));
    if (std::isfinite(*d)) o.set("value", *d);  // for people; "bits" is what is read
  } else if (const auto* b = std::get_if<bool>(&v)) {
    o.set("type", "bool");
    o.set("value", *b);
  } else {
    o.set("type", "string");
    o.set("value", std::get<std::string>(v));
  }
  return o;
}

CheckpointValue value_from_json(const JsonValue& j, const std::string& what) {
  const std::string& type = j.at("type", what).as_string(what + ".type");
  if (type == "int") return j.at("value", what).as_int(what + ".value");
  if (type == "float") return bits_double(parse_hash_hex(j.at("bits", what).as_string(what + ".bits")));
  if (type == "bool") return j.at("value", what).as_bool(what + ".value");
  if (type == "string") return j.at("value", what).as_string(what + ".value");
  corrupt(what + ".type is \"" + type + "\"; expected int, float, bool or string");
}

JsonValue shape_json(const std::vector<int64_t>& shape) {
  JsonValue a = JsonValue::array();
  for (const auto d : shape) a.push_back(d);
  return a;
}

std::vector<int64_t> parse_shape(const JsonValue& j, const std::string& what) {
  const auto& arr = j.as_array(what);
  if (arr.size() > kMaxTensorRank) corrupt(what + " has more than 16 dimensions");
  std::vector<int64_t> shape;
  for (size_t i = 0; i < arr.size(); ++i) {
    const int64_t d = arr[i].as_int(what + "[" + std::to_string(i) + "]");
    if (d < 0) corrupt(what + " has a negative dimension " + std::to_string(d));
    shape.push_back(d);
  }
  return shape;
}

uint64_t record_nbytes(DType dtype, const std::vector<int64_t>& shape, const std::string& what) {
  uint64_t n = dtype_size(dtype);
  for (const auto d : shape) n = checked_mul(n, static_cast<uint64_t>(d), what);
  return n;
}

// Parses {"dtype","shape","data_offsets"} (+ optional "xxh3" string in the manifest) into `r`.
void parse_tensor_fields(const JsonValue& j, const std::string& what, TensorRecord* r,
                         bool manifest) {
  const auto& members = j.as_object(what);
  bool has_dtype = false, has_shape = false, has_offsets = false, has_hash = false;
  for (const auto& m : members) {
    if (m.first == "dtype") {
      r->dtype = parse_dtype(m.second.as_string(what + ".dtype"));
      has_dtype = true;
    } else if (m.first == "shape") {
      r->shape = parse_shape(m.second, what + ".shape");
      has_shape = true;
    } else if (m.first == "data_offsets") {
      const auto& off = m.second.as_array(what + ".data_offsets");
      if (off.size() != 2) corrupt(what + ".data_offsets must have 2 elements");
      const int64_t b = off[0].as_int(what + ".data_offsets[0]");
      const int64_t e = off[1].as_int(what + ".data_offsets[1]");
      if (b < 0 || e < b) {
        corrupt(what + ".data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                "] is not a valid range");
      }
      r->begin = static_cast<uint64_t>(b);
      r->end = static_cast<uint64_t>(e);
      has_offsets = true;
    } else if (manifest && m.first == "xxh3") {
      r->xxh3 = parse_hash_hex(m.second.as_string(what + ".xxh3"));
      has_hash = true;
    } else {
      corrupt(what + " has an unknown member \"" + m.first + "\"");
    }
  }
  if (!has_dtype || !has_shape || !has_offsets || (manifest && !has_hash)) {
    corrupt(what + " lacks one of dtype, shape, data_offsets" + (manifest ? ", xxh3" : ""));
  }
  const uint64_t n = record_nbytes(r->dtype, r->shape, what);
  if (n != r->end - r->begin) {
    corrupt(what + " spans " + std::to_string(r->end - r->begin) + " bytes but its shape and dtype need " +
            std::to_string(n));
  }
}

// Tensors must tile [0, data_bytes) in order: first begins at 0, each begins where the previous ended.
void check_tiling(const std::vector<TensorRecord>& tensors, uint64_t* data_bytes,
                  const std::string& what) {
  uint64_t pos = 0;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (!names.insert(t.name).second) corrupt(what + " lists tensor \"" + t.name + "\" twice");
    if (t.begin != pos) {
      corrupt(what + ": tensor \"" + t.name + "\" starts at byte " + std::to_string(t.begin) +
              ", expected " + std::to_string(pos) + " (the data must be contiguous, in order)");
    }
    pos = t.end;
  }
  *data_bytes = pos;
}

JsonValue tensor_json(const TensorRecord& t, bool with_hash) {
  JsonValue o = JsonValue::object();
  o.set("dtype", dtype_name(t.dtype));
  o.set("shape", shape_json(t.shape));
  JsonValue off = JsonValue::array();
  off.push_back(t.begin);
  off.push_back(t.end);
  o.set("data_offsets", std::move(off));
  if (with_hash) o.set("xxh3", hash_hex(t.xxh3));
  return o;
}

constexpr const char* kManifestPrefix = "{\n  \"manifest_xxh3\": \"";

}  // namespace

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
  if (const auto* d = std::get_if<double>(&a)) return double_bits(*d) == double_bits(std::get<double>(b));
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

std::string encode_shard_header(ShardHeader* header, bool assign_offsets) {
  JsonValue root = JsonValue::object();
  JsonValue meta = JsonValue::object();
  meta.set("format", kCheckpointFormatName);
  meta.set("version", std::to_string(kCheckpointFormatVersion));
  meta.set("step", std::to_string(header->step));
  meta.set("rank", std::to_string(header->rank));
  meta.set("world_size", std::to_string(header->world_size));
  uint64_t pos = 0;
  for (auto& t : header->tensors) {
    check_entry_name(t.name, "tensor name");
    const uint64_t n = record_nbytes(t.dtype, t.shape, "tensor \"" + t.name + "\"");
    if (assign_offsets) {
      t.begin = pos;
      t.end = pos + n;
    }
    pos = t.end;
    meta.set(kHashPrefix + t.name, hash_hex(t.xxh3));
  }
  for (const auto& [name, v] : header->values) {
    check_entry_name(name, "value name");
    meta.set(kValuePrefix + name, encode_value_string(v));
  }
  root.set("__metadata__", std::move(meta));
  for (const auto& t : header->tensors) root.set(t.name, tensor_json(t, false));
  std::string json = root.dump();
  // Pad with spaces so the data section starts 8-byte aligned (as the safetensors writer does).
  while ((8 + json.size()) % 8 != 0) json += ' ';
  std::string out(8, '\0');
  uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xFF);
  out += json;
  header->header_bytes = out.size();
  check_tiling(header->tensors, &header->data_bytes, "shard header");
  return out;
}

uint64_t decode_shard_header_length(const unsigned char prefix[8], uint64_t file_size) {
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(prefix[i]) << (8 * i);
  if (len > kMaxShardHeaderBytes) {
    corrupt("shard header length " + std::to_string(len) + " exceeds the limit of " +
            std::to_string(kMaxShardHeaderBytes) + " bytes");
  }
  if (file_size != 0 && (file_size < 8 || len > file_size - 8)) {
    corrupt("shard header length " + std::to_string(len) + " runs past the end of the " +
            std::to_string(file_size) + "-byte file (truncated)");
  }
  return len;
}

ShardHeader parse_shard_header(std::string_view json, uint64_t file_size) {
  if (json.size() > kMaxShardHeaderBytes) corrupt("shard header too large");
  JsonLimits limits;
  limits.max_input_bytes = kMaxShardHeaderBytes;
  limits.max_depth = 8;
  const JsonValue root = parse_json(json, limits);
  ShardHeader h;
  h.header_bytes = 8 + json.size();
  bool has_meta = false;
  std::map<std::string, uint64_t> hashes;
  for (const auto& [key, val] : root.as_object("shard header")) {
    if (key == "__metadata__") {
      has_meta = true;
      bool fmt = false, ver = false, step = false, rank = false, world = false;
      for (const auto& [mk, mv] : val.as_object("shard header __metadata__")) {
        const std::string what = "shard header __metadata__[\"" + mk + "\"]";
        const std::string& s = mv.as_string(what);
        if (mk == "format") {
          if (s != kCheckpointFormatName) corrupt(what + " is \"" + s + "\", not a tandem checkpoint");
          fmt = true;
        } else if (mk == "version") {
          const int64_t v = parse_int_strict(s, what);
          if (v != kCheckpointFormatVersion) {
            corrupt("format version " + s + " is not supported (this build reads version " +
                    std::to_string(kCheckpointFormatVersion) + ")");
          }
          ver = true;
        } else if (mk == "step") {
          h.step = parse_int_strict(s, what);
          if (h.step < 0) corrupt(what + " is negative");
          step = true;
        } else if (mk == "rank") {
          const int64_t r = parse_int_strict(s, what);
          if (r < 0 || r > (1 << 24)) corrupt(what + " is out of range");
          h.rank = static_cast<int>(r);
          rank = true;
        } else if (mk == "world_size") {
          const int64_t w = parse_int_strict(s, what);
          if (w < 1 || w > (1 << 24)) corrupt(what + " is out of range");
          h.world_size = static_cast<int>(w);
          world = true;
        } else if (mk.rfind(kHashPrefix, 0) == 0) {
          hashes[mk.substr(std::strlen(kHashPrefix))] = parse_hash_hex(s);
        } else if (mk.rfind(kValuePrefix, 0) == 0) {
          const std::string name = mk.substr(std::strlen(kValuePrefix));
          check_entry_name(name, "value name");
          h.values[name] = decode_value_string(s, what);
        }
        // Other metadata keys are ignored (forward compatible, as safetensors readers do).
      }
      if (!fmt || !ver || !step || !rank || !world) {
        corrupt("shard header __metadata__ lacks one of format, version, step, rank, world_size");
      }
      if (h.rank >= h.world_size) corrupt("shard header rank is not below its world size");
      continue;
    }
    check_entry_name(key, "tensor name");
    TensorRecord r;
    r.name = key;
    parse_tensor_fields(val, "tensor \"" + key + "\"", &r, false);
    h.tensors.push_back(std::move(r));
  }
  if (!has_meta) corrupt("shard header has no __metadata__ (not a tandem checkpoint)");
  // safetensors allows any member order; the data must still tile without holes. Sort by offset.
  std::stable_sort(h.tensors.begin(), h.tensors.end(),
                   [](const TensorRecord& a, const TensorRecord& b) { return a.begin < b.begin; });
  for (auto& t : h.tensors) {
    const auto it = hashes.find(t.name);
    if (it == hashes.end()) corrupt("shard header has no checksum for tensor \"" + t.name + "\"");
    t.xxh3 = it->second;
  }
  if (hashes.size() != h.tensors.size()) corrupt("shard header has checksums for unknown tensors");
  check_tiling(h.tensors, &h.data_bytes, "shard header");
  if (file_size != 0 && h.header_bytes + h.data_bytes != file_size) {
    corrupt("shard of " + std::to_string(file_size) + " bytes should be " +
            std::to_string(h.header_bytes + h.data_bytes) + " (header " +
            std::to_string(h.header_bytes) + " + data " + std::to_string(h.data_bytes) +
            "): truncated or extended");
  }
  return h;
}

const char* sharding_name(Sharding s) { return s == Sharding::kReplicated ? "replicated" : "sharded"; }

const ManifestFile* Manifest::file_of_rank(int rank) const {
  for (const auto& f : files) {
    if (f.rank == rank) return &f;
  }
  return nullptr;
}

std::string encode_manifest(const Manifest& m) {
  JsonValue root = JsonValue::object();
  root.set("manifest_xxh3", hash_hex(0));  // placeholder, patched below
  root.set("format", kCheckpointFormatName);
  root.set("version", m.version);
  root.set("step", m.step);
  root.set("world_size", m.world_size);
  JsonValue states = JsonValue::array();
  for (const auto& s : m.states) {
    JsonValue o = JsonValue::object();
    o.set("name", s.name);
    o.set("kind", s.kind);
    o.set("sharding", sharding_name(s.sharding));
    states.push_back(std::move(o));
  }
  root.set("states", std::move(states));
  JsonValue files = JsonValue::array();
  for (const auto& f : m.files) {
    JsonValue o = JsonValue::object();
    o.set("name", f.name);
    o.set("rank", f.rank);
    o.set("bytes", f.bytes);
    o.set("xxh3", hash_hex(f.xxh3));
    o.set("header_bytes", f.header_bytes);
    JsonValue tensors = JsonValue::object();
    for (const auto& t : f.tensors) tensors.set(t.name, tensor_json(t, true));
    o.set("tensors", std::move(tensors));
    JsonValue values = JsonValue::object();
    for (const auto& [k, v] : f.values) values.set(k, value_to_json(v));
    o.set("values", std::move(values));
    files.push_back(std::move(o));
  }
  root.set("files", std::move(files));
  JsonValue meta = JsonValue::object();
  for (const auto& [k, v] : m.metadata) meta.set(k, v);
  root.set("metadata", std::move(meta));
  std::string text = root.dump(2) + "\n";
  const size_t at = std::strlen(kManifestPrefix);
  if (text.compare(0, at, kManifestPrefix) != 0) corrupt("internal error: manifest prefix");
  const std::string hex = hash_hex(xxh3_64(text.data(), text.size()));
  text.replace(at, 16, hex);
  return text;
}

Manifest parse_manifest(std::string_view text) {
  if (text.size() > kMaxManifestBytes) corrupt("manifest larger than " + std::to_string(kMaxManifestBytes) + " bytes");
  const size_t at = std::strlen(kManifestPrefix);
  if (text.size() < at + 16 || text.compare(0, at, kManifestPrefix) != 0) {
    corrupt("manifest does not start with its checksum member (not a tandem manifest, or damaged)");
  }
  const uint64_t stored = parse_hash_hex(std::string(text.substr(at, 16)));
  std::string zeroed(text);
  zeroed.replace(at, 16, std::string(16, '0'));
  const uint64_t actual = xxh3_64(zeroed.data(), zeroed.size());
  if (stored != actual) {
    corrupt("manifest checksum mismatch (stored " + hash_hex(stored) + ", computed " +
            hash_hex(actual) + "): the manifest is corrupt");
  }
  JsonLimits limits;
  limits.max_input_bytes = kMaxManifestBytes;
  limits.max_depth = 10;
  const JsonValue root = parse_json(text, limits);
  Manifest m;
  if (root.at("format", "manifest").as_string("manifest.format") != kCheckpointFormatName) {
    corrupt("manifest.format is not \"tandem-checkpoint\"");
  }
  const int64_t version = root.at("version", "manifest").as_int("manifest.version");
  if (version != kCheckpointFormatVersion) {
    corrupt("manifest format version " + std::to_string(version) +
            " is not supported (this build reads version " +
            std::to_string(kCheckpointFormatVersion) + ")");
  }
  m.version = static_cast<int>(version);
  m.step = root.at("step", "manifest").as_int("manifest.step");
  if (m.step < 0) corrupt("manifest.step is negative");
  const int64_t world = root.at("world_size", "manifest").as_int("manifest.world_size");
  if (world < 1 || world > (1 << 24)) corrupt("manifest.world_size " + std::to_string(world) + " is out of range");
  m.world_size = static_cast<int>(world);
  std::set<std::string> state_names;
  const auto& states = root.at("states", "manifest").as_array("manifest.states");
  for (size_t i = 0; i < states.size(); ++i) {
    const std::string what = "manifest.states[" + std::to_string(i) + "]";
    ManifestState s;
    s.name = states[i].at("name", what).as_string(what + ".name");
    check_entry_name(s.name, what + ".name");
    if (s.name.find('/') != std::string::npos) corrupt(what + ".name contains '/'");
    if (!state_names.insert(s.name).second) corrupt("manifest lists state \"" + s.name + "\" twice");
    s.kind = states[i].at("kind", what).as_string(what + ".kind");
    const std::string& sh = states[i].at("sharding", what).as_string(what + ".sharding");
    if (sh == "replicated") s.sharding = Sharding::kReplicated;
    else if (sh == "sharded") s.sharding = Sharding::kSharded;
    else corrupt(what + ".sharding is \"" + sh + "\"; expected replicated or sharded");
    m.states.push_back(std::move(s));
  }
  const auto& files = root.at("files", "manifest").as_array("manifest.files");
  std::set<std::string> file_names;
  int prev_rank = -1;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string what = "manifest.files[" + std::to_string(i) + "]";
    const JsonValue& jf = files[i];
    ManifestFile f;
    f.name = jf.at("name", what).as_string(what + ".name");
    const int64_t rank = jf.at("rank", what).as_int(what + ".rank");
    if (rank < 0 || rank >= m.world_size) corrupt(what + ".rank " + std::to_string(rank) + " is out of range");
    f.rank = static_cast<int>(rank);
    if (f.rank <= prev_rank) corrupt("manifest.files are not in ascending, unique rank order");
    prev_rank = f.rank;
    if (f.name != shard_file_name(f.rank)) {
      corrupt(what + ".name \"" + f.name + "\" should be \"" + shard_file_name(f.rank) + "\"");
    }
    if (!file_names.insert(f.name).second) corrupt("manifest lists file " + f.name + " twice");
    const int64_t bytes = jf.at("bytes", what).as_int(what + ".bytes");
    const int64_t hb = jf.at("header_bytes", what).as_int(what + ".header_bytes");
    if (bytes < 0 || hb < 8 || hb > bytes) corrupt(what + " has inconsistent sizes");
    f.bytes = static_cast<uint64_t>(bytes);
    f.header_bytes = static_cast<uint64_t>(hb);
    f.xxh3 = parse_hash_hex(jf.at("xxh3", what).as_string(what + ".xxh3"));
    for (const auto& [name, jt] : jf.at("tensors", what).as_object(what + ".tensors")) {
      check_entry_name(name, "tensor name");
      const auto slash = name.find('/');
      if (slash == std::string::npos || state_names.count(name.substr(0, slash)) == 0) {
        corrupt(what + ": tensor \"" + name + "\" belongs to no listed state");
      }
      TensorRecord r;
      r.name = name;
      parse_tensor_fields(jt, what + ".tensors[\"" + name + "\"]", &r, true);
      f.tensors.push_back(std::move(r));
    }
    uint64_t data_bytes = 0;
    check_tiling(f.tensors, &data_bytes, what);
    if (f.header_bytes + data_bytes != f.bytes) {
      corrupt(what + ": header " + std::to_string(f.header_bytes) + " + data " +
              std::to_string(data_bytes) + " bytes != file size " + std::to_string(f.bytes));
    }
    for (const auto& [name, jv] : jf.at("values", what).as_object(what + ".values")) {
      check_entry_name(name, "value name");
      f.values[name] = value_from_json(jv, what + ".values[\"" + name + "\"]");
    }
    m.files.push_back(std::move(f));
  }
  for (const auto& [k, v] : root.at("metadata", "manifest").as_object("manifest.metadata")) {
    m.metadata[k] = v.as_string("manifest.metadata[\"" + k + "\"]");
  }
  return m;
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

}  // namespace tandem
