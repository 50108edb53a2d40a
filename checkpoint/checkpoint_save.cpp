// Saving: collecting and staging every registered state (device tensors through
// checkpoint/device_staging.h) and handing the write to the async writer, a SerialExecutor (see
// include/tandem/checkpoint/checkpoint_manager.h).
#include "checkpoint/checkpoint_manager_impl.h"

#include <tandem/base/trace.h>

#include "checkpoint/host_buffer.h"
#include "checkpoint/training_state.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <set>

namespace tandem {

using namespace detail;

void CheckpointManager::Impl::wait_idle() { writer.drain(); }

void CheckpointManager::Impl::rethrow_error() {
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu);
    std::swap(err, error);
  }
  if (err) std::rethrow_exception(err);
}

std::vector<CheckpointManager::Impl::Entry> CheckpointManager::Impl::all_entries() {
  std::vector<Entry> all = entries;
  all.push_back({kUserState,
                 detail::values_state([this] { return user_values; },
                                      [this](const std::map<std::string, CheckpointValue>& v) { user_values = v; }),
                 Sharding::kReplicated});
  return all;
}

bool CheckpointManager::Impl::any_sharded() const {
  return std::any_of(entries.begin(), entries.end(),
                     [](const Entry& e) { return e.sharding != Sharding::kReplicated; });
}

std::unique_ptr<CheckpointManager::Impl::Job> CheckpointManager::Impl::collect(int64_t step) {
  auto job = std::make_unique<Job>();
  job->step = step;
  job->has_file = rank == 0 || any_sharded();
  std::vector<CopyTask> copies;
  std::vector<at::Tensor> copy_sources;
  size_t staged_count = 0;
  const bool may_defer = opts.async && staging_may_be_deferred();
  pinned.reset();  // the previous save is done with it (save() waited for the writer)
  for (const Entry& e : all_entries()) {
    job->states.push_back({e.name, e.state->kind(), e.sharding});
    const bool mine = e.sharding != Sharding::kReplicated || rank == 0;
    if (!mine) continue;
    StateDict d = e.state->state_dict();
    const bool stable = e.state->changes_only_in_optimizer_step();
    std::set<std::string> seen;
    for (auto& [key, tensor] : d.tensors) {
      const std::string full = e.name + "/" + key;
      check_entry_name(full, "tensor name");
      if (!seen.insert(key).second) {
        throw CheckpointError("tandem: checkpoint: state \"" + e.name + "\" has two tensors named \"" +
                              key + "\".");
      }
      if (!tensor.defined()) {
        throw CheckpointError("tandem: checkpoint: tensor \"" + full + "\" is undefined.");
      }
      if (tensor.is_meta()) {
        throw CheckpointError("tandem: checkpoint: tensor \"" + full + "\" is on the meta device, "
                              "which holds no data: give it storage and values (to_empty() and "
                              "initialise, or load weights) before saving it.");
      }
      // Parameters and optimizer state change only in an optimizer step: the writer copies them.
      const bool defer = may_defer && (stable || tensor.requires_grad());
      at::Tensor t = tensor.detach();
      if (!t.is_contiguous()) t = t.contiguous();
      TensorSource src;
      src.name = full;
      src.dtype = to_checkpoint_dtype(t.scalar_type());
      src.shape = t.sizes().vec();
      const size_t nbytes = t.numel() * t.element_size();
      if (!t.device().is_cpu()) {
        // Pinned staging, copied on the device's side stream (launched below, both modes).
        const at::Tensor buf = pinned.take(nbytes);
        job->device.add(t, buf, defer);
        if (defer) {
          job->deferred_sources.push_back(t);
          job->deferred_versions.push_back(t._version());
          job->deferred_names.push_back(full);
        }
        src.data = buf.data_ptr();
        job->keepalive.push_back(buf);
      } else if (opts.async) {
        if (staged_count >= staging_buffers.size()) staging_buffers.emplace_back();
        at::Tensor& buf = staging_buffers[staged_count++];
        if (!buf.defined() || static_cast<size_t>(buf.numel()) < nbytes) {
          buf = host_buffer({static_cast<int64_t>(std::max<size_t>(nbytes, 1))}, at::kByte);
        }
        (defer ? job->deferred : copies).push_back({buf.data_ptr(), t.data_ptr(), nbytes});
        (defer ? job->deferred_sources : copy_sources).push_back(t);  // alive until copied
        if (defer) {
          job->deferred_versions.push_back(t._version());
          job->deferred_names.push_back(full);
        }
        src.data = buf.data_ptr();
        job->keepalive.push_back(buf);
      } else {
        src.data = t.data_ptr();
        job->keepalive.push_back(t);
      }
      job->sources.push_back(std::move(src));
    }
    for (const auto& [key, v] : d.values) {
      const std::string full = e.name + "/" + key;
      check_entry_name(full, "value name");
      job->values[full] = v;
    }
  }
  // Device copies first: they run on their side streams while the host copies below do.
  job->device.launch();
  if (!copies.empty()) copy_parallel(copies);
  return job;
}

void CheckpointManager::Impl::save(int64_t step) {
  const auto t0 = Clock::now();
  if (step < 0) {
    throw CheckpointError("tandem: checkpoint: save(" + std::to_string(step) +
                          "): the step must be >= 0.");
  }
  wait_idle();  // at most one save in flight
  rethrow_error();
  std::shared_ptr<Job> job;
  {
    trace::Span span("checkpoint snapshot", trace::kCheckpoint);  // what blocks training
    if (trace::enabled()) span.arg("step", step);
    job = collect(step);
  }
  job->started = t0;
  if (!opts.async) {
    job->device.synchronize();  // the write reads the pinned copies
    job->blocked_s = seconds_since(t0);  // refined below: everything blocks in sync mode
    SaveStats s = run_job(*job);
    s.blocked_s = seconds_since(t0);
    std::lock_guard<std::mutex> lock(mu);
    stats = s;
    return;
  }
  job->blocked_s = seconds_since(t0);
  if (!job->deferred_sources.empty()) {
    std::lock_guard<std::mutex> lock(mu);
    staging = true;
  }
  // The task reports its own outcome; the executor drops it (and the staged tensors' references)
  // before wait_idle() returns.
  writer.submit([this, job] {
    std::exception_ptr err;
    SaveStats s;
    uint64_t deferred_bytes = 0;
    const auto t_copy = Clock::now();
    try {
      trace::Span span("checkpoint staging copy", trace::kCheckpoint);
      for (const auto& c : job->deferred) deferred_bytes += c.bytes;
      deferred_bytes += job->device.bytes(/*deferred=*/true);
      copy_parallel(job->deferred);
      // Every device copy, the immediate ones too (the write reads them): the host waits here,
      // on the writer's thread, never in save().
      job->device.synchronize();
      for (size_t i = 0; i < job->deferred_sources.size(); ++i) {
        if (job->deferred_sources[i]._version() == job->deferred_versions[i]) continue;
        job->staging_error =
            "tensor \"" + job->deferred_names[i] +
            "\" changed before the asynchronous save copied it (an optimizer step or an in-place "
            "change before wait_for_checkpoint_staging()). Call tandem::wait_for_checkpoint_staging() "
            "before changing parameters, or save synchronously (--set checkpoint.async=false).";
        break;
      }
    } catch (...) {
      err = std::current_exception();
    }
    const double staging_s = seconds_since(t_copy);
    job->deferred_sources.clear();
    {
      std::lock_guard<std::mutex> lock(mu);
      staging = false;
    }
    staged.notify_all();
    try {
      if (!err) s = run_job(*job);
    } catch (...) {
      err = std::current_exception();
    }
    s.deferred_bytes = deferred_bytes;
    s.staging_s = staging_s;
    std::lock_guard<std::mutex> lock(mu);
    if (err) error = err;
    else stats = s;
  });
}

void CheckpointManager::Impl::wait_staged() {
  std::unique_lock<std::mutex> lock(mu);
  staged.wait(lock, [this] { return !staging; });
}

}  // namespace tandem
