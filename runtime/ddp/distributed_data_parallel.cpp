#include <tandem/runtime/distributed_data_parallel.h>

#include <tandem/base/errors.h>
#include <tandem/base/trace.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/memory/cpu_allocator.h>

#include "base/strings.h"
#include "runtime/ddp/master_weights.h"
#include "runtime/rank_agreement.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/tensor.h>

#include <map>
#include <sstream>

namespace tandem {

namespace {

// Broadcasts `tensors` from `root` with one collective per dtype (flatten, broadcast, copy back).
void broadcast_coalesced(Communicator& comm, const std::vector<at::Tensor>& tensors, int root) {
  if (comm.size() == 1 || tensors.empty()) return;
  at::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, group] : by_dtype) {
    std::vector<at::Tensor> flat;
    for (const auto& t : group) flat.push_back(t.reshape({-1}));
    at::Tensor buffer = at::cat(flat);
    comm.broadcast(buffer, root)->wait();
    int64_t offset = 0;
    for (auto& t : group) {
      t.copy_(buffer.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

std::string describe_parameters(const std::vector<std::string>& names,
                                 const std::vector<at::Tensor>& params) {
  std::ostringstream out;
  for (size_t i = 0; i < params.size(); ++i) {
    out << names[i] << " " << params[i].sizes() << " " << params[i].scalar_type() << " "
        << params[i].device().type() << "\n";
  }
  return out.str();
}

// Every rank learns every rank's parameter list and raises the same error on a mismatch.
void verify_same_parameters(Communicator& comm, const std::string& mine) {
  if (comm.size() == 1) return;
  const std::vector<std::string> texts = detail::allgather_strings(comm, mine);
  const auto reference = strings::split_lines(texts[0]);
  for (size_t r = 1; r < texts.size(); ++r) {
    const auto other = strings::split_lines(texts[r]);
    for (size_t i = 0; i < std::max(reference.size(), other.size()); ++i) {
      const std::string a = i < reference.size() ? reference[i] : "(none)";
      const std::string b = i < other.size() ? other[i] : "(none)";
      if (a == b) continue;
      throw ConfigError(
          "tandem: DistributedDataParallel: the ranks hold different models. Rank 0 has " +
          std::to_string(reference.size()) + " parameters, rank " + std::to_string(r) + " has " +
          std::to_string(other.size()) + "; first difference at parameter #" + std::to_string(i) +
          ": rank 0 '" + a + "' vs rank " + std::to_string(r) + " '" + b +
          "'. Build the same model (same config) on every rank.");
    }
  }
}

}  // namespace

DistributedDataParallelCore::DistributedDataParallelCore(std::shared_ptr<torch::nn::Module> module,
                                                         std::shared_ptr<Communicator> comm,
                                                         DistributedDataParallelOptions options)
    : module_(std::move(module)), comm_(std::move(comm)), options_(std::move(options)) {
  if (!module_) throw ConfigError("tandem: DistributedDataParallel: module is null.");
  if (!comm_) throw ConfigError("tandem: DistributedDataParallel: communicator is null.");
  check_mixed_precision(options_.mixed_precision, "DistributedDataParallel");
  // Every parameter, frozen ones included, is checked and broadcast; only trainable ones are
  // reduced.
  std::vector<at::Tensor> all_params, params;
  std::vector<std::string> all_names, names;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    all_names.push_back(item.key());
    all_params.push_back(item.value());
    if (!item.value().requires_grad()) continue;
    names.push_back(item.key());
    params.push_back(item.value());
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) buffers_.push_back(item.value());
  check_parameter_devices(all_params, all_names, options_, "DistributedDataParallel");

  verify_same_parameters(*comm_, describe_parameters(all_names, all_params));
  std::vector<at::Tensor> state = all_params;
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_coalesced(*comm_, state, 0);

  params_ = params;
  std::vector<at::Tensor> grad_targets;  // empty: the parameters' own .grad
  if (options_.mixed_precision.enabled()) {
    std::vector<at::Tensor> frozen;
    for (const auto& p : all_params) {
      if (!p.requires_grad()) frozen.push_back(p);
    }
    masters_ = std::make_shared<detail::MasterWeights>(params, frozen, options_.mixed_precision.param_dtype);
    grad_targets = masters_->masters();
  }
  reducer_ = std::make_unique<Reducer>(std::move(params), std::move(names), comm_, options_,
                                       std::move(grad_targets));
}

std::vector<at::Tensor> DistributedDataParallelCore::parameters() const {
  return masters_ ? masters_->masters() : params_;
}

void DistributedDataParallelCore::register_checkpoint(CheckpointManager& ckpt, const std::string& name) {
  if (masters_) {
    ckpt.add(name, masters_->module_state(*module_), Sharding::kReplicated);
  } else {
    ckpt.add_module(name, *module_);
  }
}

void DistributedDataParallelCore::gather_parameters() {
  // synced_ stays: a step after this call must still reach the model at the next forward.
  if (masters_) masters_->cast_into_model(synced_);
}

at::ScalarType DistributedDataParallelCore::input_dtype() const {
  return masters_ ? options_.mixed_precision.param_dtype : at::ScalarType::Undefined;
}

DistributedDataParallelCore::~DistributedDataParallelCore() = default;

namespace {
// trace: start of the forward in flight on this thread (after the buffer broadcast, which is comm),
// and its NVTX range.
thread_local int64_t t_forward_begin_us = 0;
thread_local uint64_t t_forward_nvtx = 0;
}  // namespace

void DistributedDataParallelCore::pre_forward() {
  // First, so a joined rank's shadow step (tandem/runtime/join.h) issues what follows in order.
  if (join_active_ && at::GradMode::is_enabled()) detail::notify_join(*comm_, sync_);
  reducer_->prepare_for_forward();
  // Inside a fault-tolerant step: keep the codec's state before it, in case it aborts.
  if (auto* scope = detail::StepScope::current(); scope != nullptr && scope->join(this)) {
    reducer_->codec().keep_step_undo(true);
    step_begun_ = reducer_->steps();
  }
  if (masters_) {
    masters_->cast_into_model(synced_);  // what the optimizer stepped
    synced_ = false;
  }
  if (options_.broadcast_buffers) broadcast_buffers();
  if (trace::enabled()) {
    memory::sample_allocator_counter();
    t_forward_begin_us = trace::now_us();
  }
  if (trace::nvtx()) t_forward_nvtx = trace::nvtx_start("tandem forward");
}

void DistributedDataParallelCore::shadow_step(bool sync) {
  reducer_->prepare_for_forward();
  if (masters_) {
    masters_->cast_into_model(synced_);
    synced_ = false;
  }
  if (options_.broadcast_buffers) broadcast_buffers();
  if (sync) {
    reducer_->shadow_backward();
    synced_ = true;
  }
}

void DistributedDataParallelCore::drop_step() { reducer_->codec().undo_steps_from(step_begun_); }

void DistributedDataParallelCore::broadcast_buffers() { broadcast_coalesced(*comm_, buffers_, 0); }

void DistributedDataParallelCore::post_forward(const std::vector<at::Tensor>& outputs) {
  trace::nvtx_end(t_forward_nvtx);
  t_forward_nvtx = 0;
  if (trace::enabled() && t_forward_begin_us != 0) {
    trace::complete("forward", trace::kCompute, t_forward_begin_us, trace::now_us());
    t_forward_begin_us = 0;
  }
  if (!at::GradMode::is_enabled()) return;  // evaluation: no backward expected
  if (sync_) {
    synced_ = true;  // the optimizer may step the masters before the next forward
    reducer_->prepare_for_backward(outputs);
  } else {
    reducer_->prepare_for_accumulation();
  }
}

namespace {
constexpr const char* kBucketSizes = "ddp/bucket_sizes";
constexpr const char* kBucketParams = "ddp/bucket_params";
}  // namespace

std::map<std::string, at::Tensor> DistributedDataParallelCore::state() const {
  std::map<std::string, at::Tensor> out = reducer_->codec().state();
  if (reducer_->buckets_rebuilt()) {
    std::vector<int64_t> sizes, params;
    for (const auto& bucket : reducer_->bucket_plan()) {
      sizes.push_back(static_cast<int64_t>(bucket.size()));
      params.insert(params.end(), bucket.begin(), bucket.end());
    }
    out[kBucketSizes] = at::tensor(sizes, at::kLong);
    out[kBucketParams] = at::tensor(params, at::kLong);
  }
  return out;
}

void DistributedDataParallelCore::load_state(const std::map<std::string, at::Tensor>& state) {
  std::map<std::string, at::Tensor> codec_state = state;
  auto sizes = codec_state.find(kBucketSizes);
  auto params = codec_state.find(kBucketParams);
  if ((sizes == codec_state.end()) != (params == codec_state.end())) {
    throw ConfigError(std::string("tandem: DistributedDataParallel::load_state(): '") +
                      kBucketSizes + "' and '" + kBucketParams +
                      "' come together; the state is incomplete.");
  }
  if (sizes != codec_state.end()) {
    const at::Tensor s = sizes->second.to(at::kLong).contiguous();
    const at::Tensor p = params->second.to(at::kLong).contiguous();
    std::vector<std::vector<int64_t>> plan;
    int64_t offset = 0;
    for (int64_t b = 0; b < s.numel(); ++b) {
      const int64_t size = s.data_ptr<int64_t>()[b];
      if (size < 0 || offset + size > p.numel()) {
        throw ConfigError(
            "tandem: DistributedDataParallel::load_state(): the saved bucket plan is "
            "inconsistent (sizes exceed the parameter list); the state is damaged.");
      }
      plan.emplace_back(p.data_ptr<int64_t>() + offset, p.data_ptr<int64_t>() + offset + size);
      offset += size;
    }
    reducer_->load_bucket_plan(plan);
    codec_state.erase(kBucketSizes);
    codec_state.erase(kBucketParams);
  }
  reducer_->codec().load_state(codec_state);
}

}  // namespace tandem
