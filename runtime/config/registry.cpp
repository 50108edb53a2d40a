// The key table (include/tandem/config/options_registry.h): one entry per key, with the member it
// sets. Defaults are read from a default-constructed Config, so they cannot drift from the structs.
#include "runtime/config/key_spec.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace tandem::detail {
namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Closed or open bounds; text is what errors and docs show.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  std::string text;
  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
};

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

constexpr std::pair<const char*, int> kByteSuffixes[] = {
    {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}};

enum class Parse { kOk, kMalformed, kTooLarge };

template <class T>
Parse parse_number(std::string s, T& out, bool bytes) {
  s = trim(s);
  int shift = 0;
  if (bytes) {
    for (const auto& [suffix, bits] : kByteSuffixes) {
      const std::string suf = suffix;
      if (s.size() > suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0) {
        s = trim(s.substr(0, s.size() - suf.size()));
        shift = bits;
        break;
      }
    }
  }
  if (s.empty()) return Parse::kMalformed;
  if (!std::is_signed_v<T> && s[0] == '-') return Parse::kMalformed;
  if (s[0] == '+') s.erase(0, 1);
  const char* end = s.data() + s.size();
  if constexpr (std::is_floating_point_v<T>) {
    double v = 0;
    const auto r = std::from_chars(s.data(), end, v);
    if (r.ec != std::errc() || r.ptr != end || !std::isfinite(v)) return Parse::kMalformed;
    out = static_cast<T>(v);
  } else {
    T v = 0;
    const auto r = std::from_chars(s.data(), end, v);
    if (r.ec == std::errc::result_out_of_range && r.ptr == end) return Parse::kTooLarge;
    if (r.ec != std::errc() || r.ptr != end) return Parse::kMalformed;
    if (shift > 0) {
      if (v > (std::numeric_limits<T>::max() >> shift)) return Parse::kTooLarge;
      v = static_cast<T>(v << shift);
    }
    out = v;
  }
  return Parse::kOk;
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

SetResult ok() { return {}; }
SetResult fail(SetStatus s) { return {s, ""}; }

// The builders below take `ref`: a lambda from Config& to the member's reference.
#define TANDEM_REF(member) [](Config & c) -> auto& { return c.member; }

template <class F>
auto& read(const F& ref, const Config& c) {
  return ref(const_cast<Config&>(c));  // ref only selects a member; nothing is written
}

template <class F>
KeySpec number(const std::string& key, F ref, Range range, const std::string& doc, bool bytes = false) {
  using T = std::remove_reference_t<decltype(ref(std::declval<Config&>()))>;
  KeySpec s;
  s.info.key = key;
  s.info.type = bytes ? "bytes" : std::is_floating_point_v<T> ? "float" : std::is_signed_v<T> ? "int" : "uint";
  s.info.allowed = range.text;
  s.info.doc = doc;
  s.set = [ref, range, bytes](Config& c, const std::string& text) -> SetResult {
    T v{};
    const Parse p = parse_number<T>(text, v, bytes);
    if (p != Parse::kOk) return fail(p == Parse::kTooLarge ? SetStatus::kRange : SetStatus::kType);
    if (!range.contains(static_cast<double>(v))) return fail(SetStatus::kRange);
    ref(c) = v;
    return ok();
  };
  s.get = [ref, bytes](const Config& c) -> std::string {
    const T v = read(ref, c);
    if constexpr (std::is_floating_point_v<T>) {
      return num_text(static_cast<double>(v));
    } else {
      if (bytes) return bytes_text(static_cast<std::uint64_t>(v));
      return std::to_string(v);
    }
  };
  return s;
}

bool parse_bool(const std::string& text, bool& out) {
  const std::string t = trim(text);
  if (t == "true" || t == "1") return out = true, true;
  if (t == "false" || t == "0") return out = false, true;
  return false;
}

template <class F>
KeySpec boolean(const std::string& key, F ref, const std::string& doc) {
  KeySpec s;
  s.info.key = key;
  s.info.type = "bool";
  s.info.allowed = "true | false";
  s.info.doc = doc;
  s.set = [ref](Config& c, const std::string& text) -> SetResult {
    bool v = false;
    if (!parse_bool(text, v)) return fail(SetStatus::kType);
    ref(c) = v;
    return ok();
  };
  s.get = [ref](const Config& c) -> std::string { return read(ref, c) ? "true" : "false"; };
  return s;
}

template <class F>
KeySpec text(const std::string& key, F ref, const std::string& doc) {
  KeySpec s;
  s.info.key = key;
  s.info.type = "string";
  s.info.doc = doc;
  s.set = [ref](Config& c, const std::string& t) -> SetResult {
    ref(c) = t;
    return ok();
  };
  s.get = [ref](const Config& c) -> std::string { return read(ref, c); };
  return s;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// A member of type E chosen by name; `names[i]` is the name of `values[i]`.
template <class F, class E>
KeySpec choice(const std::string& key, F ref, std::vector<std::pair<std::string, E>> options,
               const std::string& doc) {
  KeySpec s;
  s.info.key = key;
  s.info.type = "choice";
  s.info.doc = doc;
  for (const auto& o : options) s.choices.push_back(o.first);
  s.info.allowed = join(s.choices, " | ");
  const std::vector<std::string> names = s.choices;
  s.set = [ref, options, names](Config& c, const std::string& text) -> SetResult {
    const std::string t = trim(text);
    for (const auto& o : options) {
      if (o.first == t) {
        ref(c) = o.second;
        return ok();
      }
    }
    return {SetStatus::kChoice, closest(t, names)};
  };
  s.get = [ref, options](const Config& c) -> std::string {
    for (const auto& o : options)
      if (o.second == read(ref, c)) return o.first;
    return "?";
  };
  return s;
}

template <class F>
KeySpec string_choice(const std::string& key, F ref, const std::vector<std::string>& names,
                      const std::string& doc) {
  std::vector<std::pair<std::string, std::string>> options;
  for (const auto& n : names) options.emplace_back(n, n);
  return choice(key, ref, options, doc);
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

KeySpec balance_key() {
  KeySpec s;
  s.info.key = "pipeline.balance";
  s.info.type = "list<int>";
  s.info.allowed = "each >= 1";
  s.info.doc = "Layers per stage (p * v entries); empty: split by pipeline.partition.";
  s.is_list = true;
  s.set = [](Config& c, const std::string& text) -> SetResult {
    std::string t = trim(text);
    if (!t.empty() && t.front() == '[') {
      if (t.back() != ']') return fail(SetStatus::kType);
      t = t.substr(1, t.size() - 2);
    }
    std::vector<int64_t> out;
    if (!trim(t).empty()) {
      std::size_t start = 0;
      while (true) {
        const auto comma = t.find(',', start);
        int64_t v = 0;
        if (parse_number<int64_t>(t.substr(start, comma - start), v, false) != Parse::kOk) return fail(SetStatus::kType);
        if (v < 1) return fail(SetStatus::kRange);
        out.push_back(v);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    }
    c.pipeline.balance = out;
    return ok();
  };
  s.get = [](const Config& c) {
    std::vector<std::string> items;
    for (auto v : c.pipeline.balance) items.push_back(std::to_string(v));
    return "[" + join(items, ", ") + "]";
  };
  return s;
}

std::vector<KeySpec> build() {
  using memory::StackCapture;
  std::vector<KeySpec> k;
  // comm
  k.push_back(timeout_key());
  k.push_back(text("comm.gloo_hostname", TANDEM_REF(comm.gloo_hostname),
                   "Address peers use to reach this rank; empty: 127.0.0.1 for a loopback MASTER_ADDR, else the host name."));
  k.push_back(text("comm.gloo_interface", TANDEM_REF(comm.gloo_interface),
                   "Network interface for Gloo (e.g. eth0); wins over comm.gloo_hostname when set."));
  k.push_back(boolean("comm.shared_memory", TANDEM_REF(comm.shared_memory),
                      "All-reduce through shared memory when every rank is on this host."));
  k[0].info.env_alias = "TANDEM_TIMEOUT_S";
  k[1].info.env_alias = "TANDEM_GLOO_HOSTNAME";
  k[2].info.env_alias = "TANDEM_GLOO_IFNAME";
  k[3].info.env_alias = "TANDEM_SHM";
  // ddp
  k.push_back(number("ddp.bucket_cap_mb", TANDEM_REF(ddp.bucket_cap_mb), gt(0),
                     "Later gradient buckets close at this size (MiB)."));
  k.push_back(number("ddp.first_bucket_cap_mb", TANDEM_REF(ddp.first_bucket_cap_mb), gt(0),
                     "Size of the first bucket (MiB): small, so communication starts early in backward."));
  k.push_back(boolean("ddp.find_unused_parameters", TANDEM_REF(ddp.find_unused_parameters),
                      "Mark parameters that got no gradient as ready after backward (models with unused branches)."));
  k.push_back(boolean("ddp.gradient_as_bucket_view", TANDEM_REF(ddp.gradient_as_bucket_view),
                      ".grad tensors are views into the buckets (no copy in or out)."));
  k.push_back(boolean("ddp.broadcast_buffers", TANDEM_REF(ddp.broadcast_buffers),
                      "Broadcast rank 0's buffers (e.g. batch-norm statistics) before each forward."));
  // compression
  k.push_back(string_choice(
      "compression.codec", TANDEM_REF(compression.codec),
      {"average", "fp16", "bf16", "powersgd", "topk", "sign"},
      "Gradient codec of DistributedDataParallel (docs/compression.md says when each pays off)."));
  k.push_back(string_choice("compression.wire", TANDEM_REF(compression.wire), {"fp32", "fp16", "bf16"},
                            "Precision the codec's floating tensors travel in."));
  k.push_back(number("compression.powersgd.rank", TANDEM_REF(compression.powersgd.rank), ge(1),
                     "Columns of the P and Q factors (clamped to min(rows, cols))."));
  k.push_back(number("compression.powersgd.start_iter", TANDEM_REF(compression.powersgd.start_iter), ge(0),
                     "Plain all-reduce for this many first steps."));
  k.push_back(number("compression.powersgd.min_compression_rate",
                     TANDEM_REF(compression.powersgd.min_compression_rate), ge(0),
                     "Compress a matrix only if rows*cols > rate*(rows+cols)*rank."));
  k.push_back(boolean("compression.powersgd.error_feedback", TANDEM_REF(compression.powersgd.error_feedback),
                      "Add what compression lost to the next step's gradient."));
  k.push_back(boolean("compression.powersgd.warm_start", TANDEM_REF(compression.powersgd.warm_start),
                      "Reuse last step's Q instead of a fresh random one."));
  k.push_back(number("compression.powersgd.seed", TANDEM_REF(compression.powersgd.seed), any(),
                     "Seed of the initial Q (same on every rank)."));
  k.push_back(number("compression.topk.ratio", TANDEM_REF(compression.topk.ratio), in(0, 1, true, false),
                     "Fraction of each bucket's entries sent."));
  k.push_back(boolean("compression.topk.error_feedback", TANDEM_REF(compression.topk.error_feedback),
                      "Add the entries not sent to the next step's gradient."));
  k.push_back(number("compression.topk.warmup_steps", TANDEM_REF(compression.topk.warmup_steps), ge(0),
                     "Steps over which the ratio falls from 1 to compression.topk.ratio (0: none)."));
  k.push_back(boolean("compression.sign.error_feedback", TANDEM_REF(compression.sign.error_feedback),
                      "Add what the sign lost to the next step's gradient."));
  // pipeline
  k.push_back(string_choice("pipeline.schedule", TANDEM_REF(pipeline.schedule),
                            {"gpipe", "1f1b", "interleaved", "zbh1"}, "Built-in pipeline schedule."));
  k.push_back(number("pipeline.num_microbatches", TANDEM_REF(pipeline.num_microbatches), ge(1),
                     "Microbatches each batch is cut into."));
  k.push_back(number("pipeline.virtual_stages", TANDEM_REF(pipeline.virtual_stages), ge(1),
                     "Stages per rank (for the interleaved schedule)."));
  k.push_back(balance_key());
  k.push_back(choice("pipeline.partition", TANDEM_REF(pipeline.partition),
                     std::vector<std::pair<std::string, Partition>>{{"parameters", Partition::kParameters},
                                                                    {"profile", Partition::kProfile}},
                     "Without a balance: split layers by parameter count or by measured time."));
  k.push_back(choice("pipeline.reduction", TANDEM_REF(pipeline.reduction),
                     std::vector<std::pair<std::string, LossReduction>>{{"mean", LossReduction::kMean},
                                                                        {"sum", LossReduction::kSum}},
                     "The step's loss is the mean or the sum of the microbatch losses."));
  // activation checkpointing
  k.push_back(text("activation.name", TANDEM_REF(activation.name),
                   "Names the checkpoint in error messages."));
  k.push_back(boolean("activation.preserve_rng_state", TANDEM_REF(activation.preserve_rng_state),
                      "Replay the forward's RNG state in the recompute (dropout gives the same mask)."));
  k.push_back(choice("activation.check", TANDEM_REF(activation.check),
                     std::vector<std::pair<std::string, RecomputeCheck>>{{"none", RecomputeCheck::kNone},
                                                                         {"metadata", RecomputeCheck::kMetadata},
                                                                         {"values", RecomputeCheck::kValues}},
                     "What the recompute compares with the first forward (values: for debugging, costs memory)."));
  // allocator
  k.push_back(boolean("allocator.install", TANDEM_REF(allocator.install),
                      "Route libtorch's CPU allocations through tandem's caching host stack."));
  k.push_back(number("allocator.limit_bytes", TANDEM_REF(allocator.stack.limit_bytes), any(),
                     "Cap on reserved host memory (0: no cap).", true));
  k.push_back(boolean("allocator.statistics", TANDEM_REF(allocator.stack.statistics),
                      "Keep allocation statistics above the pool."));
  k.push_back(boolean("allocator.tracking", TANDEM_REF(allocator.stack.tracking),
                      "Track every live allocation (needed for leak detection and shutdown reports)."));
  k.push_back(number("allocator.host.mmap_threshold", TANDEM_REF(allocator.stack.host.mmap_threshold), any(),
                     "Requests of at least this many bytes are mmap'd.", true));
  k.push_back(boolean("allocator.host.transparent_huge_pages", TANDEM_REF(allocator.stack.host.transparent_huge_pages),
                      "madvise(MADV_HUGEPAGE) mmap'd regions of 2 MiB or more."));
  k.push_back(number("allocator.pool.min_block_size", TANDEM_REF(allocator.stack.pool.min_block_size), ge(1),
                     "Rounding unit and block alignment (a power of two).", true));
  k.push_back(number("allocator.pool.small_size", TANDEM_REF(allocator.stack.pool.small_size), ge(1),
                     "Requests up to this size use the small pool.", true));
  k.push_back(number("allocator.pool.small_segment_size", TANDEM_REF(allocator.stack.pool.small_segment_size), ge(1),
                     "Segment size of the small pool.", true));
  k.push_back(number("allocator.pool.large_segment_size", TANDEM_REF(allocator.stack.pool.large_segment_size), ge(1),
                     "Segment size for large requests below large_segment_threshold.", true));
  k.push_back(number("allocator.pool.large_segment_threshold",
                     TANDEM_REF(allocator.stack.pool.large_segment_threshold), any(),
                     "Larger requests get a segment of their own.", true));
  k.push_back(number("allocator.pool.segment_rounding", TANDEM_REF(allocator.stack.pool.segment_rounding), ge(1),
                     "Own segments are rounded up to this.", true));
  k.push_back(number("allocator.pool.segment_alignment", TANDEM_REF(allocator.stack.pool.segment_alignment), ge(1),
                     "Alignment asked of the upstream for segments (a power of two).", true));
  k.push_back(number("allocator.pool.max_split_size", TANDEM_REF(allocator.stack.pool.max_split_size), ge(1),
                     "Blocks larger than this are never split.", true));
  k.push_back(number("allocator.pool.roundup_power2_divisions",
                     TANDEM_REF(allocator.stack.pool.roundup_power2_divisions), any(),
                     "0: round to min_block_size; N (a power of two): N steps between powers of two."));
  k.push_back(boolean("allocator.pool.thread_cache", TANDEM_REF(allocator.stack.pool.thread_cache),
                      "Lock-free per-thread cache of recently freed small blocks."));
  k.push_back(number("allocator.pool.thread_cache_max_block",
                     TANDEM_REF(allocator.stack.pool.thread_cache_max_block), any(),
                     "Largest block a thread cache keeps.", true));
  k.push_back(number("allocator.pool.thread_cache_bin_capacity",
                     TANDEM_REF(allocator.stack.pool.thread_cache_bin_capacity), any(),
                     "Blocks a thread cache keeps per size."));
  k.push_back(number("allocator.pool.thread_cache_max_bytes",
                     TANDEM_REF(allocator.stack.pool.thread_cache_max_bytes), any(),
                     "Bytes a thread cache keeps.", true));
  k.push_back(choice("allocator.tracking_options.stacks", TANDEM_REF(allocator.stack.tracking_options.stacks),
                     std::vector<std::pair<std::string, StackCapture>>{{"none", StackCapture::kNone},
                                                                       {"sampled", StackCapture::kSampled},
                                                                       {"all", StackCapture::kAll}},
                     "When tracking captures the allocating stack."));
  k.push_back(number("allocator.tracking_options.sample_every",
                     TANDEM_REF(allocator.stack.tracking_options.sample_every), ge(1),
                     "With stacks = sampled: one allocation in this many per thread."));
  k.push_back(number("allocator.tracking_options.max_frames",
                     TANDEM_REF(allocator.stack.tracking_options.max_frames), ge(1), "Frames kept per stack."));
  k.push_back(boolean("allocator.tracking_options.report_at_exit",
                      TANDEM_REF(allocator.stack.tracking_options.report_at_exit),
                      "Print live allocations by site at exit (default on in debug builds)."));
  k.push_back(number("allocator.tracking_options.timeline_capacity",
                     TANDEM_REF(allocator.stack.tracking_options.timeline_capacity), any(),
                     "mark_step() points kept for snapshots."));
  k.push_back(number("allocator.leaks.window", TANDEM_REF(allocator.leaks.window), ge(2),
                     "Steps a site must grow over to be reported as a leak."));
  k.push_back(number("allocator.leaks.min_growing_fraction", TANDEM_REF(allocator.leaks.min_growing_fraction),
                     in(0, 1, false, false), "Fraction of step-to-step changes that must be increases."));
  k.push_back(number("allocator.leaks.min_bytes_per_step", TANDEM_REF(allocator.leaks.min_bytes_per_step), ge(0),
                     "Smaller average growth is ignored."));
  // checkpoint
  k.push_back(text("checkpoint.directory", TANDEM_REF(checkpoint.directory),
                   "Root directory of the step directories (shared by all ranks)."));
  k.push_back(number("checkpoint.every_n_steps", TANDEM_REF(checkpoint.every_n_steps), ge(0),
                     "maybe_save(step) saves when step % every_n_steps == 0 (0: never)."));
  k.push_back(number("checkpoint.keep_last", TANDEM_REF(checkpoint.keep_last), ge(0),
                     "Committed checkpoints kept (0: all)."));
  k.push_back(boolean("checkpoint.async", TANDEM_REF(checkpoint.async),
                      "Write and commit on a background thread."));
  k.push_back(choice("checkpoint.reshard", TANDEM_REF(checkpoint.reshard),
                     std::vector<std::pair<std::string, ReshardPolicy>>{
                         {"error", ReshardPolicy::kError}, {"load_replicated_only", ReshardPolicy::kLoadReplicatedOnly}},
                     "What resume() does with sharded state saved at another world size."));
  // trace, metrics
  k.push_back(boolean("trace.enabled", TANDEM_REF(trace.enabled), "Record spans to Chrome-trace JSON."));
  k.push_back(text("trace.dir", TANDEM_REF(trace.dir), "Each rank writes <dir>/rank<R>.json."));
  k.push_back(boolean("trace.allocator_events", TANDEM_REF(trace.allocator_events),
                      "Also record allocator counters."));
  k.push_back(number("trace.max_events", TANDEM_REF(trace.max_events), ge(1),
                     "Events kept per process; later ones are dropped."));
  k.push_back(number("metrics.log_every", TANDEM_REF(metrics.log_every), ge(0),
                     "Steps between progress lines (0: none)."));
  k.push_back(text("metrics.file", TANDEM_REF(metrics.file), "JSON-lines metrics of rank 0 (empty: none)."));
  // train
  k.push_back(number("train.steps", TANDEM_REF(train.steps), ge(0), "Training steps."));
  k.push_back(number("train.seed", TANDEM_REF(train.seed), any(), "Seed of weights and data order."));
  k.push_back(number("train.batch_size", TANDEM_REF(train.batch_size), ge(1), "Samples per step and rank."));
  k.push_back(number("train.lr", TANDEM_REF(train.lr), gt(0), "Learning rate."));
  k.push_back(number("train.weight_decay", TANDEM_REF(train.weight_decay), ge(0), "Weight decay."));
  k.push_back(text("train.data", TANDEM_REF(train.data), "Input file (empty: the program's synthetic data)."));

  const Config defaults;
  std::set<std::string> envs;
  for (auto& s : k) {
    s.info.env = env_name(s.info.key);
    s.info.default_value = s.get(defaults);
    if (!envs.insert(s.info.env).second || (!s.info.env_alias.empty() && !envs.insert(s.info.env_alias).second))
      throw std::logic_error("tandem config registry: two keys map to " + s.info.env);
  }
  return k;
}

#undef TANDEM_REF

}  // namespace

const std::vector<KeySpec>& specs() {
  static const std::vector<KeySpec> all = build();
  return all;
}

const KeySpec* find_spec(const std::string& key) {
  for (const auto& s : specs())
    if (s.info.key == key) return &s;
  return nullptr;
}

std::string env_name(const std::string& key) {
  std::string out = "TANDEM_";
  for (char c : key) out += c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  // A typo, not a different word: at most a third of the word, and at least 2 edits allowed.
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  return best_d <= limit ? best : "";
}

}  // namespace tandem::detail
