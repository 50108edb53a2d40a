// The non-template parts of the key builders (runtime/config/key_builders.h) and the two keys
// with their own parsing: comm.timeout_s and pipeline.balance.
#include "runtime/config/key_builders.h"

#include <chrono>

namespace tandem::detail {

std::string num_text(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}
Range any() { return {}; }
Range ge(double lo) { return {lo, std::numeric_limits<double>::infinity(), false, false, ">= " + num_text(lo)}; }
Range gt(double lo) { return {lo, std::numeric_limits<double>::infinity(), true, false, "> " + num_text(lo)}; }
Range in(double lo, double hi, bool lo_open, bool hi_open) {
  return {lo, hi, lo_open, hi_open,
          std::string(lo_open ? "(" : "[") + num_text(lo) + ", " + num_text(hi) + (hi_open ? ")" : "]")};
}

std::string bytes_text(std::uint64_t v) {
  if (v == 0) return "0";
  for (const auto& [suffix, bits] : kByteSuffixes) {
    const std::string suf = suffix;
    if (suf.size() == 3 && v % (std::uint64_t{1} << bits) == 0)
      return std::to_string(v >> bits) + suf;
  }
  return std::to_string(v);
}

bool parse_bool(const std::string& text, bool& out) {
  const std::string t = strings::trim(text);
  if (t == "true" || t == "1") return out = true, true;
  if (t == "false" || t == "0") return out = false, true;
  return false;
}

// Seconds in config, milliseconds in InitOptions.
KeySpec timeout_key() {
  KeySpec s;
  s.info.key = "comm.timeout_s";
  s.info.type = "float";
  s.info.allowed = "> 0";
  s.info.doc = "Rendezvous, store and collective timeout in seconds; a longer wait raises TimeoutError.";
  s.set = [](Config& c, const std::string& t) -> SetResult {
    double v = 0;
    if (parse_number<double>(t, v, false) != Parse::kOk) return fail(SetStatus::kType);
    if (!(v > 0) || v > 1e9) return fail(SetStatus::kRange);
    c.comm.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(v * 1000)));
    return ok();
  };
  s.get = [](const Config& c) { return num_text(static_cast<double>(c.comm.timeout.count()) / 1000); };
  return s;
}

KeySpec device_key() {
  KeySpec s;
  s.info.key = "train.device";
  s.info.type = "choice";
  s.info.allowed = "auto | cpu | cuda | cuda:N";
  s.info.doc = "Where the model trains: auto (cuda:LOCAL_RANK when a CUDA device exists, else "
               "cpu), cpu, cuda (cuda:LOCAL_RANK) or cuda:N.";
  s.choices = {"auto", "cpu", "cuda", "cuda:0"};
  s.set = [](Config& c, const std::string& text) -> SetResult {
    const std::string t = strings::trim(text);
    const bool indexed = strings::starts_with(t, "cuda:") && strings::parse_int(t.substr(5)) &&
                         *strings::parse_int(t.substr(5)) >= 0;
    if (t != "auto" && t != "cpu" && t != "cuda" && !indexed) {
      return {SetStatus::kChoice, closest(t, {"auto", "cpu", "cuda", "cuda:0"})};
    }
    c.train.device = t;
    return ok();
  };
  s.get = [](const Config& c) { return c.train.device; };
  return s;
}

KeySpec balance_key() {
  KeySpec s;
  s.info.key = "pipeline.balance";
  s.info.type = "list<int>";
  s.info.allowed = "each >= 1";
  s.info.doc = "Layers per stage (p * v entries); empty: split by pipeline.partition.";
  s.is_list = true;
  s.set = [](Config& c, const std::string& text) -> SetResult {
    std::string t = strings::trim(text);
    if (!t.empty() && t.front() == '[') {
      if (t.back() != ']') return fail(SetStatus::kType);
      t = t.substr(1, t.size() - 2);
    }
    std::vector<int64_t> out;
    if (!strings::trim(t).empty()) {
      for (const std::string& item : strings::split(t, ',')) {
        int64_t v = 0;
        if (parse_number<int64_t>(item, v, false) != Parse::kOk) return fail(SetStatus::kType);
        if (v < 1) return fail(SetStatus::kRange);
        out.push_back(v);
      }
    }
    c.pipeline.balance = out;
    return ok();
  };
  s.get = [](const Config& c) {
    std::vector<std::string> items;
    for (auto v : c.pipeline.balance) items.push_back(std::to_string(v));
    return "[" + strings::join(items, ", ") + "]";
  };
  return s;
}

}  // namespace tandem::detail
