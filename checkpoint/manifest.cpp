// The manifest: manifest.json with its embedded checksum, every file's records and the states
// (see include/tandem/checkpoint/format.h). No torch headers.
#include <tandem/checkpoint/format.h>

#include <tandem/base/errors.h>

#include "base/json.h"
#include "checkpoint/tensor_records.h"

#include <cmath>
#include <cstring>
#include <set>

namespace tandem {

using detail::corrupt;

namespace {

JsonValue value_to_json(const CheckpointValue& v) {
  JsonValue o = JsonValue::object();
  if (const auto* i = std::get_if<int64_t>(&v)) {
    o.set("type", "int");
    o.set("value", *i);
  } else if (const auto* d = std::get_if<double>(&v)) {
    o.set("type", "float");
    o.set("bits", hash_hex(detail::double_bits(*d)));
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
  if (type == "float") return detail::bits_double(parse_hash_hex(j.at("bits", what).as_string(what + ".bits")));
  if (type == "bool") return j.at("value", what).as_bool(what + ".value");
  if (type == "string") return j.at("value", what).as_string(what + ".value");
  corrupt(what + ".type is \"" + type + "\"; expected int, float, bool or string");
}

constexpr const char* kManifestPrefix = "{\n  \"manifest_xxh3\": \"";

}  // namespace

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::kReplicated: return "replicated";
    case Sharding::kSharded: return "sharded";
    case Sharding::kSliced: return "sliced";
  }
  return "?";
}

const ManifestFile* Manifest::file_of_rank(int rank) const {
  for (const auto& f : files) {
    if (f.rank == rank) return &f;
  }
  return nullptr;
}

std::string encode_manifest(const Manifest& m) {
  JsonValue root = JsonValue::object();
  root.set_errors(JsonErrors::kCheckpoint);  // what cannot be written is said as a checkpoint's
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
    for (const auto& t : f.tensors) tensors.set(t.name, detail::tensor_json(t, true));
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
  const JsonValue root = parse_json(text, JsonErrors::kCheckpoint, limits);
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
    else if (sh == "sliced") s.sharding = Sharding::kSliced;
    else corrupt(what + ".sharding is \"" + sh + "\"; expected replicated, sharded or sliced");
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
      detail::parse_tensor_fields(jt, what + ".tensors[\"" + name + "\"]", &r, true);
      f.tensors.push_back(std::move(r));
    }
    uint64_t data_bytes = 0;
    detail::check_tiling(f.tensors, &data_bytes, what);
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

}  // namespace tandem
