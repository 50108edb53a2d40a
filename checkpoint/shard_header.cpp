// Shard headers: the safetensors-compatible length prefix and JSON header of a rank's file
// (see include/tandem/checkpoint/format.h). No torch headers.
#include <tandem/checkpoint/format.h>

#include <tandem/base/errors.h>

#include "base/json.h"
#include "checkpoint/tensor_records.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

namespace tandem {

using detail::corrupt;

namespace {

constexpr const char* kValuePrefix = "value.";
constexpr const char* kHashPrefix = "xxh3.";

// Shard-header value encoding (a string): "int:30", "float:3f50624dd2f1a9fc" (IEEE bits),
// "bool:true", "str:<utf-8>".
std::string encode_value_string(const CheckpointValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return "int:" + std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return "float:" + hash_hex(detail::double_bits(*d));
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
  if (s.rfind("float:", 0) == 0) return detail::bits_double(parse_hash_hex(s.substr(6)));
  if (s == "bool:true") return true;
  if (s == "bool:false") return false;
  if (s.rfind("str:", 0) == 0) return s.substr(4);
  corrupt(what + " has an unknown value encoding: \"" + s.substr(0, 32) + "\"");
}

}  // namespace

std::string encode_shard_header(ShardHeader* header, bool assign_offsets) {
  JsonValue root = JsonValue::object();
  root.set_errors(JsonErrors::kCheckpoint);  // what cannot be written is said as a checkpoint's
  JsonValue meta = JsonValue::object();
  meta.set("format", kCheckpointFormatName);
  meta.set("version", std::to_string(kCheckpointFormatVersion));
  meta.set("step", std::to_string(header->step));
  meta.set("rank", std::to_string(header->rank));
  meta.set("world_size", std::to_string(header->world_size));
  uint64_t pos = 0;
  for (auto& t : header->tensors) {
    check_entry_name(t.name, "tensor name");
    const uint64_t n = detail::record_nbytes(t.dtype, t.shape, "tensor \"" + t.name + "\"");
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
  for (const auto& t : header->tensors) root.set(t.name, detail::tensor_json(t, false));
  std::string json = root.dump();
  // Pad with spaces so the data section starts 8-byte aligned (as the safetensors writer does).
  while ((8 + json.size()) % 8 != 0) json += ' ';
  std::string out(8, '\0');
  uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xFF);
  out += json;
  header->header_bytes = out.size();
  detail::check_tiling(header->tensors, &header->data_bytes, "shard header");
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
  // safetensors pads the header with spaces; anything else after the JSON is damage (the JSON
  // parser would stop at a NUL there, and no checksum over the header is recomputed on load).
  const size_t last = json.find_last_not_of(' ');
  if (last == std::string_view::npos || json[last] != '}') {
    corrupt("shard header does not end in '}' followed only by space padding");
  }
  JsonLimits limits;
  limits.max_input_bytes = kMaxShardHeaderBytes;
  limits.max_depth = 8;
  const JsonValue root = parse_json(json, JsonErrors::kCheckpoint, limits);
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
    detail::parse_tensor_fields(val, "tensor \"" + key + "\"", &r, false);
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
  detail::check_tiling(h.tensors, &h.data_bytes, "shard header");
  if (file_size != 0 && h.header_bytes + h.data_bytes != file_size) {
    corrupt("shard of " + std::to_string(file_size) + " bytes should be " +
            std::to_string(h.header_bytes + h.data_bytes) + " (header " +
            std::to_string(h.header_bytes) + " + data " + std::to_string(h.data_bytes) +
            "): truncated or extended");
  }
  return h;
}

}  // namespace tandem
