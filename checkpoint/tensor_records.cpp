// Tensor records in JSON, shared by shard headers and the manifest (see checkpoint/tensor_records.h).
#include "checkpoint/tensor_records.h"

#include <tandem/base/errors.h>

#include <cstring>
#include <limits>
#include <set>

namespace tandem::detail {
namespace {

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& what) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) corrupt(what + ": size overflows");
  return a * b;
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

}  // namespace

void corrupt(const std::string& what) { throw CheckpointError("tandem: checkpoint: " + what); }

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

uint64_t record_nbytes(DType dtype, const std::vector<int64_t>& shape, const std::string& what) {
  uint64_t n = dtype_size(dtype);
  for (const auto d : shape) n = checked_mul(n, static_cast<uint64_t>(d), what);
  return n;
}

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

}  // namespace tandem::detail
