// make_codec(): codecs by name with string parameters, as configs hold them.
#include <tandem/collectives/compression.h>

#include <tandem/base/errors.h>

#include <cerrno>
#include <cstdlib>
#include <set>

namespace tandem {

namespace {

// Reads a codec's parameters; every key must be consumed, so typos fail loudly.
class Params {
 public:
  Params(std::string codec, const std::map<std::string, std::string>& values)
      : codec_(std::move(codec)), values_(values) {}

  template <class T>
  void read(const std::string& key, T* out) {
    known_.insert(key);
    auto it = values_.find(key);
    if (it != values_.end()) *out = parse(key, it->second, out);
  }

  // Throws ConfigError for a key no read() asked for.
  void finish() const {
    for (const auto& [key, value] : values_) {
      if (known_.count(key)) continue;
      std::string valid;
      for (const auto& k : known_) valid += (valid.empty() ? "" : ", ") + k;
      throw ConfigError("tandem: codec '" + codec_ + "' has no parameter '" + key +
                        "' (given '" + value + "'); its parameters are: " +
                        (valid.empty() ? "none" : valid) + ".");
    }
  }

 private:
  [[noreturn]] void bad(const std::string& key, const std::string& value,
                        const char* expected) const {
    throw ConfigError("tandem: codec '" + codec_ + "': parameter '" + key + "' = '" + value +
                      "' is not " + expected + ".");
  }
  int64_t parse(const std::string& key, const std::string& v, int64_t*) const {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0) bad(key, v, "an integer");
    return x;
  }
  uint64_t parse(const std::string& key, const std::string& v, uint64_t*) const {
    char* end = nullptr;
    errno = 0;
    const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
    if (v.empty() || v[0] == '-' || *end != '\0' || errno != 0) bad(key, v, "an unsigned integer");
    return x;
  }
  double parse(const std::string& key, const std::string& v, double*) const {
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno != 0) bad(key, v, "a number");
    return x;
  }
  bool parse(const std::string& key, const std::string& v, bool*) const {
    if (v == "true" || v == "1") return true;
    if (v == "false" || v == "0") return false;
    bad(key, v, "a boolean (true, false, 1, 0)");
  }
  std::string parse(const std::string&, const std::string& v, std::string*) const { return v; }

  std::string codec_;
  const std::map<std::string, std::string>& values_;
  std::set<std::string> known_;
};

}  // namespace

std::shared_ptr<GradCodec> make_codec(const std::string& name,
                                      const std::map<std::string, std::string>& params) {
  Params p(name, params);
  std::string wire = "fp32";
  p.read("wire", &wire);
  std::shared_ptr<GradCodec> codec;
  if (name == "average") {
    codec = make_average_codec();
  } else if (name == "fp16" || name == "bf16") {
    codec = make_average_codec();
    if (wire != "fp32" && wire != name) {
      throw ConfigError("tandem: codec '" + name + "' cannot take wire = " + wire +
                        "; use codec '" + wire + "' instead.");
    }
    wire = name;
  } else if (name == "powersgd") {
    PowerSgdOptions o;
    p.read("rank", &o.rank);
    p.read("start_iter", &o.start_iter);
    p.read("min_compression_rate", &o.min_compression_rate);
    p.read("error_feedback", &o.error_feedback);
    p.read("warm_start", &o.warm_start);
    p.read("seed", &o.seed);
    p.finish();
    codec = make_powersgd_codec(o);
  } else if (name == "topk") {
    TopKOptions o;
    p.read("ratio", &o.ratio);
    p.read("error_feedback", &o.error_feedback);
    p.read("warmup_steps", &o.warmup_steps);
    p.finish();
    codec = make_topk_codec(o);
  } else if (name == "auto") {
    AutoOptions o;
    p.read("min_speedup", &o.min_speedup);
    p.finish();
    if (wire == "fp16") {
      o.wire = at::kHalf;
    } else if (wire != "fp32" && wire != "bf16") {
      throw ConfigError("tandem: codec 'auto': parameter 'wire' = '" + wire +
                        "' is not fp16 or bf16 (the cast auto may choose; default bf16).");
    }
    return make_auto_codec(o);
  } else if (name == "sign") {
    SignOptions o;
    p.read("error_feedback", &o.error_feedback);
    p.finish();
    codec = make_sign_codec(o);
  } else {
    throw ConfigError("tandem: unknown gradient codec '" + name +
                      "'; the codecs are: average, fp16, bf16, auto, powersgd, topk, sign.");
  }
  p.finish();
  if (wire == "fp32") return codec;
  if (wire == "fp16") return make_cast_codec(at::kHalf, codec);
  if (wire == "bf16") return make_cast_codec(at::kBFloat16, codec);
  throw ConfigError("tandem: codec '" + name + "': parameter 'wire' = '" + wire +
                    "' is not one of fp32, fp16, bf16.");
}

}  // namespace tandem
