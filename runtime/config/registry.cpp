// The key table (include/tandem/runtime/config_keys.h): one entry per key, with the member it
// sets. Defaults are read from a default-constructed Config, so they cannot drift from the structs.
// The builders the entries are made with are in key_builders.h.
#include "runtime/config/key_builders.h"

#include "base/strings.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <set>
#include <stdexcept>

namespace tandem::detail {
namespace {

// The builders take this: a lambda from Config& to the member's reference.
#define TANDEM_REF(member) [](Config & c) -> auto& { return c.member; }

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
                      "Allreduce, reduce-scatter and all-gather through shared memory when every rank is on this host."));
  k.push_back(string_choice("comm.backend", TANDEM_REF(comm.backend), {"auto", "gloo", "nccl"},
                            "CUDA tensors over NCCL, CPU tensors over Gloo (auto: when this build has NCCL and the machine a GPU)."));
  k[0].info.env_alias = "TANDEM_TIMEOUT_S";
  k[1].info.env_alias = "TANDEM_GLOO_HOSTNAME";
  k[2].info.env_alias = "TANDEM_GLOO_IFNAME";
  k[3].info.env_alias = "TANDEM_SHM";
  // parallel
  k.push_back(number("parallel.pp", TANDEM_REF(parallel.pp), ge(1),
                     "Pipeline stages (Context::mesh()): consecutive ranks form one pipeline; the world holds world_size / pp of them, data parallel."));
  // ddp
  k.push_back(number("ddp.bucket_cap_mb", TANDEM_REF(ddp.bucket_cap_mb), gt(0),
                     "Later gradient buckets close at this size (MiB)."));
  k.push_back(number("ddp.first_bucket_cap_mb", TANDEM_REF(ddp.first_bucket_cap_mb), gt(0),
                     "Size of the first bucket (MiB): small, so communication starts early in backward."));
  k.push_back(boolean("ddp.find_unused_parameters", TANDEM_REF(ddp.find_unused_parameters),
                      "Mark parameters that got no gradient as ready after backward (models with unused branches)."));
  k.push_back(boolean("ddp.gradient_as_bucket_view", TANDEM_REF(ddp.gradient_as_bucket_view),
                      ".grad tensors are views into the buckets (no copy in or out)."));
  k.push_back(choice("ddp.overlap", TANDEM_REF(ddp.overlap),
                     std::vector<std::pair<std::string, DistributedDataParallelOptions::Overlap>>{
                         {"auto", DistributedDataParallelOptions::Overlap::kAuto},
                         {"true", DistributedDataParallelOptions::Overlap::kOn},
                         {"false", DistributedDataParallelOptions::Overlap::kOff}},
                     "Reduce buckets while backward runs (auto: only with a core to spare for communication on this host)."));
  k.push_back(boolean("ddp.broadcast_buffers", TANDEM_REF(ddp.broadcast_buffers),
                      "Broadcast rank 0's buffers (e.g. batch-norm statistics) before each forward."));
  // sharding
  k.push_back(number("sharding.stage", TANDEM_REF(sharding.stage), in(0, 3, false, false),
                     "What ShardedDataParallel shards: 0 nothing (every rank replicates, as DistributedDataParallel); 1 optimizer state; 2 + gradients; 3 + parameters."));
  k.push_back(boolean("sharding.reshard_after_forward", TANDEM_REF(sharding.reshard_after_forward),
                      "Stage 3: free a unit's full parameters after its forward (gather again for backward)."));
  k.push_back(boolean("sharding.prefetch", TANDEM_REF(sharding.prefetch),
                      "Stage 3: gather the next unit while the current one computes."));
  k.push_back(string_choice("sharding.backward_prefetch", TANDEM_REF(sharding.backward_prefetch), {"pre", "post"},
                            "Stage 3, backward: prefetch the next unit when the current unit's backward starts (pre: more overlap, one unit more memory) or when its gradients are in (post)."));
  k.push_back(number("sharding.group_size", TANDEM_REF(sharding.group_size), ge(0),
                     "Ranks one shard spans (0: all); smaller: shard inside groups, replicate across (hybrid)."));
  k.push_back(string_choice("sharding.reduce_dtype", TANDEM_REF(sharding.reduce_dtype), {"fp32", "fp16", "bf16"},
                            "Precision of the reduce-scattered gradients on the wire."));
  // compression
  k.push_back(string_choice(
      "compression.codec", TANDEM_REF(compression.codec),
      {"average", "fp16", "bf16", "auto", "powersgd", "topk", "sign"},
      "Gradient codec of DistributedDataParallel (docs/compression.md says when each pays off; "
      "auto measures the link and picks average or the wire cast)."));
  k.push_back(string_choice("compression.wire", TANDEM_REF(compression.wire), {"fp32", "fp16", "bf16"},
                            "Precision the codec's floating tensors travel in (for auto: the cast it may "
                            "choose, fp32 meaning bf16)."));
  k.push_back(number("compression.auto.min_speedup", TANDEM_REF(compression.automatic.min_speedup), ge(0),
                     "auto casts only if that makes a probe all-reduce at least this many times faster."));
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
  // precision
  const std::vector<std::pair<std::string, at::ScalarType>> dtypes = {
      {"fp32", at::kFloat}, {"bf16", at::kBFloat16}, {"fp16", at::kHalf}};
  k.push_back(choice("precision.param_dtype", TANDEM_REF(ddp.mixed_precision.param_dtype), dtypes,
                     "Parameters' dtype in forward and backward (bf16/fp16: fp32 masters are what the optimizer steps)."));
  k.push_back(boolean("precision.reduce_in_fp32", TANDEM_REF(ddp.mixed_precision.reduce_in_fp32),
                      "Reduce the gradients of low-precision parameters in fp32 (false: in param_dtype)."));
  k.push_back(choice("precision.autocast", TANDEM_REF(precision.autocast), dtypes,
                     "Autocast the forward to this dtype (fp32: off; CPU: bf16; CUDA: fp16 or bf16)."));
  k.push_back(choice("precision.scaler.enabled", TANDEM_REF(precision.scaler_mode),
                     std::vector<std::pair<std::string, PrecisionConfig::Scaler>>{
                         {"auto", PrecisionConfig::Scaler::kAuto},
                         {"true", PrecisionConfig::Scaler::kOn},
                         {"false", PrecisionConfig::Scaler::kOff}},
                     "Dynamic loss scaling (auto: when autocast or the parameters are fp16)."));
  k.push_back(number("precision.scaler.init_scale", TANDEM_REF(precision.scaler.init_scale), gt(0),
                     "Initial loss scale."));
  k.push_back(number("precision.scaler.growth_factor", TANDEM_REF(precision.scaler.growth_factor), gt(1),
                     "The scale grows by this after growth_interval steps without inf/NaN."));
  k.push_back(number("precision.scaler.backoff_factor", TANDEM_REF(precision.scaler.backoff_factor),
                     in(0, 1, true, true), "The scale shrinks by this on a step with inf/NaN (skipped)."));
  k.push_back(number("precision.scaler.growth_interval", TANDEM_REF(precision.scaler.growth_interval), ge(1),
                     "Clean steps in a row before the scale grows."));
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
  // ft
  k.push_back(boolean("ft.enabled", TANDEM_REF(ft.enabled),
                      "Step-level fault tolerance under tandemrun --ft: a dead rank costs one step, the survivors go on."));
  k.push_back(number("ft.min_replicas", TANDEM_REF(ft.min_replicas), ge(1),
                     "Fewest ranks that go on after a failure; fewer fail the group (restart from the checkpoint)."));
  k.push_back(number("ft.quorum_timeout_s", TANDEM_REF(ft.quorum_timeout_s), gt(0),
                     "Seconds survivors wait for a rank neither voting nor reported dead."));
  k.push_back(number("ft.replacement_wait_s", TANDEM_REF(ft.replacement_wait_s), ge(0),
                     "Seconds survivors wait for a dead rank's replacement (tandemrun --ft-replace) before going on without it."));
  // trace, metrics
  k.push_back(boolean("trace.enabled", TANDEM_REF(trace.enabled), "Record spans to Chrome-trace JSON."));
  k.push_back(text("trace.dir", TANDEM_REF(trace.dir), "Each rank writes <dir>/rank<R>.json."));
  k.push_back(boolean("trace.allocator_events", TANDEM_REF(trace.allocator_events),
                      "Also record allocator counters."));
  k.push_back(number("trace.max_events", TANDEM_REF(trace.max_events), ge(1),
                     "Events kept per process; later ones are dropped."));
  k.push_back(boolean("trace.nvtx", TANDEM_REF(trace.nvtx),
                      "NVTX ranges around forward, backward, buckets, collectives and checkpoint phases (Nsight Systems; CUDA builds)."));
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
  k.push_back(device_key());

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

std::vector<KeySpec>& registry() {
  static std::vector<KeySpec> all = build();
  return all;
}

const std::vector<KeySpec>& specs() { return registry(); }

int registry_generation = 0;

void add_app_spec(KeySpec spec) {
  spec.info.env = env_name(spec.info.key);
  for (const auto& s : registry()) {
    if (s.info.key == spec.info.key) {
      throw ConfigError("tandem: register_app_key: '" + spec.info.key + "' is registered twice.");
    }
    if (s.info.env == spec.info.env || s.info.env_alias == spec.info.env) {
      throw ConfigError("tandem: register_app_key: '" + spec.info.key + "' and '" + s.info.key +
                        "' both map to " + spec.info.env + "; rename one.");
    }
  }
  registry().push_back(std::move(spec));
  ++registry_generation;
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

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& c : candidates) {
    const std::size_t d = strings::edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  // A typo, not a different word: at most a third of the word, and at least 2 edits allowed.
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  return best_d <= limit ? best : "";
}

}  // namespace tandem::detail
