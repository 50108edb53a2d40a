// CheckpointManager: construction, registration of states and user values, and the public calls
// (saving is in checkpoint_save.cpp and checkpoint_commit.cpp, resuming in checkpoint_resume.cpp;
// see include/tandem/checkpoint/checkpoint_manager.h).
#include <tandem/checkpoint/checkpoint_manager.h>

#include "checkpoint/checkpoint_file_system.h"
#include "checkpoint/checkpoint_manager_impl.h"
#include "checkpoint/training_state.h"

#include <tandem/collectives/device_mesh.h>

#include <atomic>
#include <iostream>
#include <mutex>
#include <set>
#include <string>

namespace tandem {

using namespace detail;

void CheckpointManager::Impl::warn(const std::string& msg) const {
  if (opts.on_warning) {
    opts.on_warning(msg);
  } else {
    std::cerr << "tandem: warning: " << msg << std::endl;
  }
}

namespace {

// The live managers, for wait_for_checkpoint_staging().
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::set<CheckpointManager*>& registry() {
  static std::set<CheckpointManager*> managers;
  return managers;
}

std::atomic<int> fences{0};

}  // namespace

CheckpointStagingFence::CheckpointStagingFence() { ++fences; }
CheckpointStagingFence::~CheckpointStagingFence() { --fences; }

bool detail::staging_may_be_deferred() { return fences.load() > 0; }

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
  d.fs = detail::checkpoint_file_system(d.opts.file_system);
  if (d.opts.communicator && d.opts.communicator->size() > 1) {
    // A lane of its own over every rank: the writer thread's ops never interleave with the
    // training's, nor with another manager's.
    const int n = d.opts.communicator->size();
    d.comm = DeviceMesh(d.opts.communicator, {{"world", n}}).group({"world"}, "checkpoint");
    d.rank = d.comm->rank();
    d.world = d.comm->size();
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().insert(this);
}

void wait_for_checkpoint_staging() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (CheckpointManager* m : registry()) m->wait_staged();
}

CheckpointManager::~CheckpointManager() {
  Impl& d = *impl_;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().erase(this);
  }
  d.wait_idle();
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
  if (sharding == Sharding::kSliced && !dynamic_cast<SlicedCheckpointable*>(state.get())) {
    throw CheckpointError("tandem: checkpoint: state \"" + name + "\" is registered as sliced but "
                          "is not a SlicedCheckpointable (resume() must ask it which pieces it wants).");
  }
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
    bool changes_only_in_optimizer_step() const override { return inner->changes_only_in_optimizer_step(); }
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

void CheckpointManager::wait_staged() { impl_->wait_staged(); }

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
