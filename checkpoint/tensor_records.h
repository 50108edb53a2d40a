// The JSON form of tensor records and the checks both readers share: shard headers
// (shard_header.cpp) and the manifest (manifest.cpp). Not installed; no torch headers.
#pragma once

#include <tandem/checkpoint/format.h>

#include "base/json.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::detail {

// Throws CheckpointError("tandem: checkpoint: " + what).
[[noreturn]] void corrupt(const std::string& what);

// A double's IEEE bits and back (values are stored by their bits, NaN payloads included).
uint64_t double_bits(double d);
double bits_double(uint64_t b);

// Bytes of a tensor of `dtype` and `shape`; throws naming `what` when the size overflows.
uint64_t record_nbytes(DType dtype, const std::vector<int64_t>& shape, const std::string& what);

// {"dtype","shape","data_offsets"} (+ "xxh3" in the manifest, `with_hash`).
JsonValue tensor_json(const TensorRecord& t, bool with_hash);

// Parses tensor_json()'s members into `r` (name left as is): every member present, no unknown
// one, offsets a valid range of exactly the bytes the shape and dtype need.
void parse_tensor_fields(const JsonValue& j, const std::string& what, TensorRecord* r,
                         bool manifest);

// Tensors must tile [0, data_bytes) in order: the first begins at 0, each begins where the
// previous ended, names are unique. Sets *data_bytes.
void check_tiling(const std::vector<TensorRecord>& tensors, uint64_t* data_bytes,
                  const std::string& what);

}  // namespace tandem::detail
