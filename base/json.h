// Strict JSON, the project's JSON home (checkpoint headers and manifests, error files, traces,
// metrics lines, tuning records): a thin wrapper over nlohmann-json (its lexer, parser and
// serializer) that adds what a reader of hostile files needs and nlohmann does not enforce itself.
//
// Reading (parse_json) accepts RFC 8259 JSON and rejects everything else: trailing commas,
// comments, NaN/Infinity, leading zeros, unescaped control characters, invalid UTF-8 and unpaired
// surrogates, a byte-order mark, trailing bytes (nlohmann's strict mode), plus duplicate object
// keys and nesting deeper, input larger or strings longer than JsonLimits (enforced here, in the
// SAX handler). The parser is fuzzed (tests/checkpoint/fuzz/) and never executes anything.
//
// Numbers: an integer literal that fits int64_t is kept exactly (is_int()); other numbers become
// doubles. The writer prints int64 exactly and doubles in the shortest form that reads back to the
// same bits (at most 17 significant digits, always with a '.' or exponent so they stay doubles);
// it refuses non-finite doubles and strings that are not valid UTF-8. Object members keep their
// order, so dump() is deterministic.
//
// Ownership: JsonValue is a plain value that owns its children.
// Thread-safety: const methods may be called concurrently; parse_json is reentrant.
// Errors: saying at which byte offset and what was expected (reading), which member had the
// wrong type or is missing (typed access), or what cannot be written (dump), raised as the
// caller's JsonErrors asks: JsonError with the bare sentence, base's own words, for a caller that
// names its own file (a trace, an error file, a tune record), or CheckpointError in a checkpoint's
// words where checkpoint/ asks for them.
#pragma once

#include <tandem/base/errors.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

// A JSON text that is malformed, a member of the wrong type or missing, or a value that cannot be
// written, as base/json says it: the bare sentence ("malformed JSON at byte 12: expected value",
// "traceEvents must be a JSON array, got string"), for the caller to word for its file.
class JsonError : public Error {
 public:
  using Error::Error;
};

// How a value reports its errors. A parsed value and all of it keep the mode of their parse_json
// call; a value built in code has kPlain unless set_errors() says otherwise, and dump() raises in
// the mode of the value dumped.
enum class JsonErrors : unsigned char {
  // JsonError with the bare sentence: a file whose reader names it in its own words.
  kPlain,
  // CheckpointError in a checkpoint's words: "tandem: checkpoint: <what>; the file is corrupt or not
  // a tandem checkpoint." What checkpoint/ reads and writes (manifests, shard headers, records).
  kCheckpoint,
};

struct JsonLimits {
  size_t max_input_bytes = 256u << 20;  // 256 MiB
  int max_depth = 64;                   // values nested deeper than this are rejected
  size_t max_string_bytes = 64u << 20;
};

class JsonValue {
 public:
  enum class Type { kNull, kBool, kInt, kDouble, kString, kArray, kObject };
  using Member = std::pair<std::string, JsonValue>;

  JsonValue() = default;  // null
  JsonValue(bool v) : type_(Type::kBool), bool_(v) {}           // NOLINT(runtime/explicit)
  JsonValue(int v) : type_(Type::kInt), int_(v) {}              // NOLINT
  JsonValue(int64_t v) : type_(Type::kInt), int_(v) {}          // NOLINT
  JsonValue(uint64_t v);                                        // NOLINT; must fit int64
  JsonValue(double v) : type_(Type::kDouble), double_(v) {}     // NOLINT
  JsonValue(const char* v) : type_(Type::kString), string_(v) {}  // NOLINT
  JsonValue(std::string v) : type_(Type::kString), string_(std::move(v)) {}  // NOLINT

  static JsonValue array();
  static JsonValue object();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kDouble; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Typed access; a wrong type throws (errors()) naming `what` (e.g. "manifest.step").
  bool as_bool(const std::string& what) const;
  int64_t as_int(const std::string& what) const;
  double as_double(const std::string& what) const;  // ints convert
  const std::string& as_string(const std::string& what) const;
  const std::vector<JsonValue>& as_array(const std::string& what) const;
  const std::vector<Member>& as_object(const std::string& what) const;

  // Object access. find() returns nullptr when absent (or not an object); at() throws naming `what`.
  const JsonValue* find(std::string_view key) const;
  const JsonValue& at(std::string_view key, const std::string& what) const;

  // Building. push_back on arrays, set on objects (appends; no duplicate check: the caller owns keys).
  JsonValue& push_back(JsonValue v);
  JsonValue& set(std::string key, JsonValue v);

  // Serialises (nlohmann's serializer). indent < 0: compact (no spaces); otherwise pretty with that
  // many spaces per level.
  std::string dump(int indent = -1) const;

  // How this value raises its errors (see JsonErrors). set_errors() sets it for this value only.
  JsonErrors errors() const { return errors_; }
  void set_errors(JsonErrors errors) { errors_ = errors; }

 private:
  Type type_ = Type::kNull;
  JsonErrors errors_ = JsonErrors::kPlain;  // in the padding after type_: no size cost
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  std::vector<JsonValue> array_;
  std::vector<Member> object_;
};

// Parses exactly one JSON value spanning all of `text` (whitespace around it allowed). Errors, and
// the value's own later ones, are raised as `errors` says.
JsonValue parse_json(std::string_view text, JsonErrors errors, const JsonLimits& limits = {});

// Appends `s` as a JSON string literal (with quotes) to `out`; bytes that are not valid UTF-8
// become U+FFFD, so the output is always valid JSON.
void append_json_string(std::string& out, std::string_view s);

// True when `s` is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace tandem
