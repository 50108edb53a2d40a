// CheckpointManager: registration, staging, the async writer and the two-phase commit across
// ranks (resume is in checkpoint_resume.cpp; see include/tandem/checkpoint/checkpoint_manager.h).
#include <tandem/checkpoint/checkpoint_manager.h>

#include <tandem/base/trace.h>
#include <tandem/collectives/communicator.h>

#include "checkpoint/step_directory.h"

#include "checkpoint/checkpoint_manager_impl.h"
#include "checkpoint/training_state.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

namespace tandem {

using namespace detail;

namespace detail {

at::Tensor host_buffer(at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t numel = 1;
  for (const auto d : shape) numel *= d;
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  constexpr size_t kHuge = size_t{2} << 20;
  if (nbytes < kHuge) return at::empty(shape, dtype);
  const size_t rounded = (nbytes + kHuge - 1) / kHuge * kHuge;
  void* p = nullptr;
  if (posix_memalign(&p, kHuge, rounded) != 0 || p == nullptr) {
    throw CheckpointError("tandem: checkpoint: cannot allocate " + std::to_string(nbytes) +
                          " bytes of host memory for checkpoint data.");
  }
#ifdef MADV_HUGEPAGE
  ::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
  return at::from_blob(p, shape, [](void* q) { std::free(q); }, at::TensorOptions().dtype(dtype));
}

}  // namespace detail

void CheckpointManager::Impl::warn(const std::string& msg) const {
  if (opts.on_warning) {
    opts.on_warning(msg);
  } else {
    std::cerr << "tandem: warning: " << msg << std::endl;
  }
}

int64_t CheckpointManager::Impl::allreduce_int(int64_t v, ReduceOp op) const {
  if (!comm) return v;
  at::Tensor t = at::empty({1}, at::kLong);
  t.data_ptr<int64_t>()[0] = v;
  comm->allreduce(t, op)->wait();
  return t.data_ptr<int64_t>()[0];
}

std::vector<ShardReport> CheckpointManager::Impl::exchange_reports(const ShardReport& mine, bool ok,
                                                                   std::vector<int>* failed) const {
  std::vector<ShardReport> all;
  if (!comm) {
    if (!ok) failed->push_back(rank);
    all.push_back(mine);
    return all;
  }
  constexpr int kFields = 5;
  at::Tensor in = at::empty({kFields}, at::kLong);
  at::Tensor out = at::empty({kFields * world}, at::kLong);
  int64_t* p = in.data_ptr<int64_t>();
  p[0] = ok ? 1 : 0;
  p[1] = mine.wrote ? 1 : 0;
  p[2] = static_cast<int64_t>(mine.bytes);
  std::memcpy(&p[3], &mine.xxh3, sizeof(uint64_t));
  p[4] = static_cast<int64_t>(mine.header_bytes);
  comm->allgather(out, in)->wait();
  const int64_t* q = out.data_ptr<int64_t>();
  for (int r = 0; r < world; ++r) {
    const int64_t* f = q + r * kFields;
    ShardReport rep;
    rep.rank = r;
    rep.wrote = f[1] != 0;
    rep.bytes = static_cast<uint64_t>(f[2]);
    std::memcpy(&rep.xxh3, &f[3], sizeof(uint64_t));
    rep.header_bytes = static_cast<uint64_t>(f[4]);
    if (f[0] == 0) failed->push_back(r);
    all.push_back(rep);
  }
  return all;
}

void CheckpointManager::Impl::writer_loop() {
  pthread_setname_np(pthread_self(), "tandem-ckpt");
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    cv.wait(lock, [&] { return stop || pending != nullptr; });
    if (pending == nullptr) return;  // stop requested and nothing left to write
    std::unique_ptr<Job> job = std::move(pending);
    lock.unlock();
    std::exception_ptr err;
    SaveStats s;
    try {
      s = run_job(*job);
    } catch (...) {
      err = std::current_exception();
    }
    job.reset();  // release the staged tensors' references before reporting idle
    lock.lock();
    if (err) error = err;
    else stats = s;
    busy = false;
    cv.notify_all();
  }
}

SaveStats CheckpointManager::Impl::run_job(Job& job) {
  SaveStats s;
  s.step = job.step;
  s.blocked_s = job.blocked_s;
  ShardReport mine;
  mine.rank = rank;
  std::string local_error;
  const auto t_write = Clock::now();
  try {
    trace::Span span("checkpoint write", trace::kCheckpoint);
    if (trace::enabled()) span.arg("step", job.step);
    if (job.has_file) {
      const ShardWriteResult w = write_shard(*fs, opts.directory, job.step, rank, world,
                                             std::move(job.sources), job.values);
      mine.wrote = true;
      mine.bytes = w.bytes;
      mine.xxh3 = w.xxh3;
      mine.header_bytes = w.header_bytes;
    }
  } catch (const CrashError&) {
    throw;  // simulated process death: nothing more happens on this rank
  } catch (const std::exception& e) {
    local_error = e.what();
  }
  s.write_s = seconds_since(t_write);
  s.bytes = mine.bytes;
  const auto t_commit = Clock::now();
  trace::Span commit_span("checkpoint commit", trace::kCheckpoint);
  std::vector<int> failed;
  const std::vector<ShardReport> reports = exchange_reports(mine, local_error.empty(), &failed);
  std::string commit_error;
  int64_t committed = 0;
  if (rank == 0 && failed.empty()) {
    try {
      commit_step(*fs, opts.directory, job.step, world, job.states, reports, opts.metadata);
      committed = 1;
    } catch (const CrashError&) {
      throw;
    } catch (const std::exception& e) {
      commit_error = e.what();
    }
  }
  if (comm) {
    at::Tensor t = at::empty({1}, at::kLong);
    t.data_ptr<int64_t>()[0] = committed;
    comm->broadcast(t, 0)->wait();
    committed = t.data_ptr<int64_t>()[0];
  }
  s.commit_s = seconds_since(t_commit);
  commit_span.end();
  s.total_s = seconds_since(job.started);
  const std::string step = "step " + std::to_string(job.step);
  if (!local_error.empty()) {
    throw CheckpointError("tandem: checkpoint: " + step + " was not saved: rank " +
                          std::to_string(rank) + " could not write its shard: " +
                          strip_prefix(local_error) + " The previous checkpoint stays the newest valid one.");
  }
  if (!failed.empty()) {
    std::string ranks;
    for (const int r : failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    throw CheckpointError("tandem: checkpoint: " + step + " was not committed: rank(s) " + ranks +
                          " failed to write their shards (see their errors). The previous "
                          "checkpoint stays the newest valid one.");
  }
  if (committed == 0) {
    throw CheckpointError("tandem: checkpoint: " + step + " was not committed: " +
                          (rank == 0 ? strip_prefix(commit_error) : "rank 0 failed to commit it (see its error).") +
                          " The previous checkpoint stays the newest valid one.");
  }
  if (rank == 0) {
    try {
      remove_old_steps(*fs, opts.directory, opts.keep_last, job.step);
    } catch (const CrashError&) {
      throw;
    } catch (const std::exception& e) {
      warn("removing old checkpoints after committing " + step + " failed: " + strip_prefix(e.what()));
    }
  }
  return s;
}

void CheckpointManager::Impl::wait_idle() {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return !busy; });
}

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
                     [](const Entry& e) { return e.sharding == Sharding::kSharded; });
}

std::unique_ptr<CheckpointManager::Impl::Job> CheckpointManager::Impl::collect(int64_t step) {
  auto job = std::make_unique<Job>();
  job->step = step;
  job->has_file = rank == 0 || any_sharded();
  std::vector<CopyTask> copies;
  std::vector<at::Tensor> copy_sources;
  size_t staged = 0;
  for (const Entry& e : all_entries()) {
    job->states.push_back({e.name, e.state->kind(), e.sharding});
    const bool mine = e.sharding == Sharding::kSharded || rank == 0;
    if (!mine) continue;
    StateDict d = e.state->state_dict();
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
      at::Tensor t = tensor.detach();
      if (t.device().type() != c10::DeviceType::CPU) t = t.to(c10::Device(c10::DeviceType::CPU));
      if (!t.is_contiguous()) t = t.contiguous();
      TensorSource src;
      src.name = full;
      src.dtype = to_checkpoint_dtype(t.scalar_type());
      src.shape = t.sizes().vec();
      const size_t nbytes = t.numel() * t.element_size();
      if (opts.async) {
        if (staged >= staging.size()) staging.emplace_back();
        at::Tensor& buf = staging[staged++];
        if (!buf.defined() || static_cast<size_t>(buf.numel()) < nbytes) {
          buf = host_buffer({static_cast<int64_t>(std::max<size_t>(nbytes, 1))}, at::kByte);
        }
        copies.push_back({buf.data_ptr(), t.data_ptr(), nbytes});
        copy_sources.push_back(t);  // alive until the copy below ran
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
  std::unique_ptr<Job> job;
  {
    trace::Span span("checkpoint snapshot", trace::kCheckpoint);  // what blocks training
    if (trace::enabled()) span.arg("step", step);
    job = collect(step);
  }
  job->started = t0;
  if (!opts.async) {
    job->blocked_s = seconds_since(t0);  // refined below: everything blocks in sync mode
    SaveStats s = run_job(*job);
    s.blocked_s = seconds_since(t0);
    std::lock_guard<std::mutex> lock(mu);
    stats = s;
    return;
  }
  job->blocked_s = seconds_since(t0);
  std::lock_guard<std::mutex> lock(mu);
  pending = std::move(job);
  busy = true;
  cv.notify_all();
}


CheckpointManager::CheckpointManager(CheckpointManagerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.opts = std::move(options);
  if (d.opts.directory.empty()) {
    throw CheckpointError("tandem: checkpoint: CheckpointManagerOptions::directory is empty; set it "
                          "to the directory that holds the step directories.");
  }
  if (d.opts.keep_last < 0 || d.opts.every_n_steps < 0) {
    throw CheckpointError("tandem: checkpoint: keep_last (" + std::to_string(d.opts.keep_last) +
                          ") and every_n_steps (" + std::to_string(d.opts.every_n_steps) +
                          ") must be >= 0.");
  }
  d.fs = d.opts.file_system ? d.opts.file_system : posix_file_system();
  if (d.opts.communicator && d.opts.communicator->size() > 1) {
    std::vector<int> all(static_cast<size_t>(d.opts.communicator->size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    d.comm = d.opts.communicator->new_group(all);
    d.rank = d.comm->rank();
    d.world = d.comm->size();
  }
  if (d.opts.async) d.writer = std::thread([this] { impl_->writer_loop(); });
}

CheckpointManager::~CheckpointManager() {
  Impl& d = *impl_;
  if (d.writer.joinable()) {
    {
      std::lock_guard<std::mutex> lock(d.mu);
      d.stop = true;
      d.cv.notify_all();
    }
    d.writer.join();
  }
  if (d.error) {
    try {
      std::rethrow_exception(d.error);
    } catch (const std::exception& e) {
      d.warn(std::string("an asynchronous checkpoint save failed and was never reported (the manager "
                         "was destroyed first): ") + e.what());
    }
  }
}

void CheckpointManager::add(const std::string& name, std::shared_ptr<Checkpointable> state,
                            Sharding sharding) {
  check_entry_name(name, "state name");
  if (name.find('/') != std::string::npos) {
    throw CheckpointError("tandem: checkpoint: state name \"" + name + "\" may not contain '/'.");
  }
  if (name == kUserState) {
    throw CheckpointError("tandem: checkpoint: the state name \"user\" is reserved for set_value().");
  }
  for (const auto& e : impl_->entries) {
    if (e.name == name) throw CheckpointError("tandem: checkpoint: a state named \"" + name + "\" is already registered.");
  }
  if (!state) throw CheckpointError("tandem: checkpoint: state \"" + name + "\" is null.");
  impl_->entries.push_back({name, std::move(state), sharding});
}

void CheckpointManager::add_module(const std::string& name, torch::nn::Module& module, Sharding sharding) {
  add(name, detail::module_state(module), sharding);
}

void CheckpointManager::add_module(const std::string& name, const std::shared_ptr<torch::nn::Module>& module,
                                   Sharding sharding) {
  if (!module) throw CheckpointError("tandem: checkpoint: module \"" + name + "\" is null.");
  // The adapter refers to the module; keep it alive as long as the manager.
  struct Holder final : Checkpointable {
    std::shared_ptr<torch::nn::Module> m;
    std::shared_ptr<Checkpointable> inner;
    std::string kind() const override { return inner->kind(); }
    StateDict state_dict() override { return inner->state_dict(); }
    std::string check(const StateDict& l) override { return inner->check(l); }
    void load(const StateDict& l) override { inner->load(l); }
  };
  auto h = std::make_shared<Holder>();
  h->m = module;
  h->inner = detail::module_state(*module);
  add(name, h, sharding);
}

void CheckpointManager::add_optimizer(const std::string& name, torch::optim::Optimizer& optimizer,
                                      Sharding sharding) {
  add(name, detail::optimizer_state(optimizer, name), sharding);
}

void CheckpointManager::add_rng(const std::string& name, at::Generator generator, Sharding sharding) {
  add(name, detail::generator_state(std::move(generator)), sharding);
}

void CheckpointManager::add_tensors(const std::string& name,
                                    std::function<std::map<std::string, at::Tensor>()> get,
                                    std::function<void(const std::map<std::string, at::Tensor>&)> set,
                                    Sharding sharding) {
  add(name, detail::tensors_state(std::move(get), std::move(set)), sharding);
}

void CheckpointManager::add_values(const std::string& name,
                                   std::function<std::map<std::string, CheckpointValue>()> get,
                                   std::function<void(const std::map<std::string, CheckpointValue>&)> set,
                                   Sharding sharding) {
  add(name, detail::values_state(std::move(get), std::move(set)), sharding);
}

void CheckpointManager::set_value(const std::string& key, CheckpointValue value) {
  check_entry_name(key, "value name");
  impl_->user_values[key] = std::move(value);
}

std::optional<CheckpointValue> CheckpointManager::value(const std::string& key) const {
  const auto it = impl_->user_values.find(key);
  if (it == impl_->user_values.end()) return std::nullopt;
  return it->second;
}

int64_t CheckpointManager::resume() { return impl_->resume(); }

bool CheckpointManager::maybe_save(int64_t step) {
  const int64_t n = impl_->opts.every_n_steps;
  if (n <= 0 || step <= 0 || step % n != 0) return false;
  save(step);
  return true;
}

void CheckpointManager::save(int64_t step) { impl_->save(step); }

void CheckpointManager::wait() {
  impl_->wait_idle();
  impl_->rethrow_error();
}

std::vector<int64_t> CheckpointManager::committed_steps() const {
  if (!impl_->fs->exists(impl_->opts.directory)) return {};
  return list_steps(*impl_->fs, impl_->opts.directory).committed;
}

int64_t CheckpointManager::resumed_step() const { return impl_->resumed; }

SaveStats CheckpointManager::last_save_stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

const CheckpointManagerOptions& CheckpointManager::options() const { return impl_->opts; }

}  // namespace tandem
