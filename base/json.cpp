// Strict JSON over nlohmann-json (see base/json.h): nlohmann lexes, validates and serialises; the
// SAX handler here builds JsonValue and adds the limits, duplicate-key and non-finite checks.
#include "base/json.h"

#include <tandem/base/errors.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <iterator>
#include <limits>
#include <unordered_set>

namespace tandem {
namespace {

using nlohmann::ordered_json;

const char* type_name(JsonValue::Type t) {
  switch (t) {
    case JsonValue::Type::kNull: return "null";
    case JsonValue::Type::kBool: return "boolean";
    case JsonValue::Type::kInt: return "integer";
    case JsonValue::Type::kDouble: return "number";
    case JsonValue::Type::kString: return "string";
    case JsonValue::Type::kArray: return "array";
    case JsonValue::Type::kObject: return "object";
  }
  return "?";
}

// Raises `sentence` as `mode` asks; `corrupt`: the file's content is at fault (a checkpoint's
// message then says what that means), not the writer's value.
[[noreturn]] void raise(JsonErrors mode, const std::string& sentence, bool corrupt) {
  if (mode == JsonErrors::kPlain) throw JsonError(sentence);
  throw CheckpointError("tandem: checkpoint: " + sentence +
                        (corrupt ? "; the file is corrupt or not a tandem checkpoint." : "."));
}

[[noreturn]] void type_error(JsonErrors mode, const std::string& what, const char* want,
                             JsonValue::Type got) {
  raise(mode, what + " must be a JSON " + want + ", got " + type_name(got), true);
}

[[noreturn]] void malformed(JsonErrors mode, size_t offset, const std::string& why) {
  raise(mode, "malformed JSON at byte " + std::to_string(offset) + ": " + why, false);
}

// The input as nlohmann reads it, one byte at a time, recording how far it got: the SAX callbacks
// have no position of their own, and an error must say where it is.
class TrackedInput {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackedInput(const char* p, const char** read_to) : p_(p), read_to_(read_to) {}
  reference operator*() const { return *p_; }
  TrackedInput& operator++() {
    *read_to_ = ++p_;
    return *this;
  }
  bool operator==(const TrackedInput& o) const { return p_ == o.p_; }
  bool operator!=(const TrackedInput& o) const { return p_ != o.p_; }

 private:
  const char* p_;
  const char** read_to_;
};

// Builds the JsonValue tree. Containers being filled are on `open_`; a child container is pushed
// into its parent first and filled in place (the parent does not grow until the child is closed).
class Builder {
 public:
  Builder(const JsonLimits& limits, JsonErrors errors, const char* begin, const char* const* read_to)
      : limits_(limits), errors_(errors), begin_(begin), read_to_(read_to) {}

  JsonValue take() { return std::move(root_); }

  bool null() { return add(JsonValue()); }
  bool boolean(bool v) { return add(JsonValue(v)); }
  bool number_integer(int64_t v) { return add(JsonValue(v)); }
  // nlohmann reads non-negative integers as unsigned; above int64 they become doubles (callers that
  // need an exact integer reject them).
  bool number_unsigned(uint64_t v) {
    if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return add(JsonValue(static_cast<int64_t>(v)));
    }
    return add(JsonValue(static_cast<double>(v)));
  }
  bool number_float(double v, const std::string&) {
    if (!std::isfinite(v)) fail("number out of range");
    return add(JsonValue(v));
  }
  bool string(std::string& s) {
    check_string(s);
    return add(JsonValue(std::move(s)));
  }
  bool binary(ordered_json::binary_t&) { fail("binary data is not JSON"); }
  bool start_object(size_t) { return open(JsonValue::object()); }
  bool start_array(size_t) { return open(JsonValue::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    check_string(k);
    if (!keys_.back().insert(k).second) fail("duplicate key \"" + printable(k) + "\"");
    key_ = std::move(k);
    return true;
  }
  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 4: <what was expected>"
    std::string what = e.what();
    if (const size_t tag = what.find("] "); tag != std::string::npos) what.erase(0, tag + 2);
    if (const size_t at = what.find(": "); what.rfind("parse error", 0) == 0 && at != std::string::npos) {
      what.erase(0, at + 2);
    }
    malformed(errors_, position, printable(what));
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    malformed(errors_, static_cast<size_t>(*read_to_ - begin_), why);
  }

  // Bytes that could garble a message (input echoed back) shown as '?'.
  static std::string printable(std::string s) {
    for (char& c : s) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    }
    return s;
  }

  void check_string(const std::string& s) const {
    if (s.size() > limits_.max_string_bytes) {
      fail("string longer than " + std::to_string(limits_.max_string_bytes) + " bytes");
    }
  }

  // Appends `v` where the parser is: the root, the open array, or the open object's current key.
  JsonValue* place(JsonValue v) {
    if (open_.size() > static_cast<size_t>(limits_.max_depth)) {
      fail("nesting deeper than " + std::to_string(limits_.max_depth));
    }
    v.set_errors(errors_);
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    JsonValue& parent = *open_.back();
    return parent.is_array() ? &parent.push_back(std::move(v)) : &parent.set(std::move(key_), std::move(v));
  }
  bool add(JsonValue v) {
    place(std::move(v));
    return true;
  }
  bool open(JsonValue container) {
    const bool object = container.is_object();
    open_.push_back(place(std::move(container)));
    if (object) keys_.emplace_back();
    return true;
  }
  bool close() {
    if (open_.back()->is_object()) keys_.pop_back();
    open_.pop_back();
    return true;
  }

  const JsonLimits& limits_;
  const JsonErrors errors_;
  const char* begin_;
  const char* const* read_to_;
  JsonValue root_;
  std::vector<JsonValue*> open_;
  std::vector<std::unordered_set<std::string>> keys_;  // per open object
  std::string key_;
};

// The nlohmann value to serialise; object members are appended as they are (the caller owns keys),
// without ordered_map's linear search for an existing key.
ordered_json to_nlohmann(const JsonValue& v, JsonErrors mode) {
  switch (v.type()) {
    case JsonValue::Type::kNull: return nullptr;
    case JsonValue::Type::kBool: return v.as_bool("");
    case JsonValue::Type::kInt: return v.as_int("");
    case JsonValue::Type::kDouble: {
      const double d = v.as_double("");
      if (!std::isfinite(d)) raise(mode, "cannot write a non-finite number to JSON", false);
      return d;
    }
    case JsonValue::Type::kString: return v.as_string("");
    case JsonValue::Type::kArray: {
      ordered_json a = ordered_json::array();
      auto& items = a.get_ref<ordered_json::array_t&>();
      items.reserve(v.as_array("").size());
      for (const auto& e : v.as_array("")) items.push_back(to_nlohmann(e, mode));
      return a;
    }
    case JsonValue::Type::kObject: {
      ordered_json o = ordered_json::object();
      using Members = ordered_json::object_t::Container;
      auto& members = static_cast<Members&>(o.get_ref<ordered_json::object_t&>());
      members.reserve(v.as_object("").size());
      for (const auto& [k, e] : v.as_object("")) members.emplace_back(k, to_nlohmann(e, mode));
      return o;
    }
  }
  return nullptr;
}

}  // namespace

JsonValue::JsonValue(uint64_t v) : type_(Type::kInt) {
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    raise(errors_, "integer " + std::to_string(v) + " does not fit the JSON integers tandem writes (int64)",
          false);
  }
  int_ = static_cast<int64_t>(v);
}

JsonValue JsonValue::array() {
  JsonValue v;
  v.type_ = Type::kArray;
  return v;
}

JsonValue JsonValue::object() {
  JsonValue v;
  v.type_ = Type::kObject;
  return v;
}

bool JsonValue::as_bool(const std::string& what) const {
  if (type_ != Type::kBool) type_error(errors_, what, "boolean", type_);
  return bool_;
}

int64_t JsonValue::as_int(const std::string& what) const {
  if (type_ != Type::kInt) type_error(errors_, what, "integer", type_);
  return int_;
}

double JsonValue::as_double(const std::string& what) const {
  if (type_ == Type::kInt) return static_cast<double>(int_);
  if (type_ != Type::kDouble) type_error(errors_, what, "number", type_);
  return double_;
}

const std::string& JsonValue::as_string(const std::string& what) const {
  if (type_ != Type::kString) type_error(errors_, what, "string", type_);
  return string_;
}

const std::vector<JsonValue>& JsonValue::as_array(const std::string& what) const {
  if (type_ != Type::kArray) type_error(errors_, what, "array", type_);
  return array_;
}

const std::vector<JsonValue::Member>& JsonValue::as_object(const std::string& what) const {
  if (type_ != Type::kObject) type_error(errors_, what, "object", type_);
  return object_;
}

const JsonValue* JsonValue::find(std::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& m : object_) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

const JsonValue& JsonValue::at(std::string_view key, const std::string& what) const {
  as_object(what);
  const JsonValue* v = find(key);
  if (v == nullptr) {
    raise(errors_, what + " has no \"" + std::string(key) + "\" member", true);
  }
  return *v;
}

JsonValue& JsonValue::push_back(JsonValue v) {
  if (type_ != Type::kArray) type_error(errors_, "push_back target", "array", type_);
  array_.push_back(std::move(v));
  return array_.back();
}

JsonValue& JsonValue::set(std::string key, JsonValue v) {
  if (type_ != Type::kObject) type_error(errors_, "set target", "object", type_);
  object_.emplace_back(std::move(key), std::move(v));
  return object_.back().second;
}

std::string JsonValue::dump(int indent) const {
  try {
    return to_nlohmann(*this, errors_).dump(indent < 0 ? -1 : indent);
  } catch (const ordered_json::type_error& e) {  // 316: a string is not valid UTF-8
    raise(errors_, std::string("cannot write JSON: ") + e.what() +
                       "; names and string values must be valid UTF-8",
          false);
  }
}

JsonValue parse_json(std::string_view text, JsonErrors errors, const JsonLimits& limits) {
  if (text.size() > limits.max_input_bytes) {
    malformed(errors, 0, "input of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                             std::to_string(limits.max_input_bytes));
  }
  // nlohmann skips a UTF-8 byte-order mark; RFC 8259 forbids one in JSON text.
  if (text.substr(0, 3) == "\xEF\xBB\xBF") malformed(errors, 0, "byte-order mark before the value");
  const char* read_to = text.data();
  Builder builder(limits, errors, text.data(), &read_to);
  ordered_json::sax_parse(TrackedInput(text.data(), &read_to),
                          TrackedInput(text.data() + text.size(), &read_to), &builder,
                          ordered_json::input_format_t::json, /*strict=*/true,
                          /*ignore_comments=*/false);
  return builder.take();
}

void append_json_string(std::string& out, std::string_view s) {
  out += ordered_json(std::string(s)).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

bool is_valid_utf8(std::string_view s) {
  try {
    (void)ordered_json(std::string(s)).dump();
    return true;
  } catch (const ordered_json::type_error&) {
    return false;
  }
}

}  // namespace tandem
