// CheckpointManager::resume(): every rank verifies its candidates, the ranks agree on the newest
// step valid everywhere, then all apply it (see include/tandem/checkpoint/checkpoint_manager.h).
#include "checkpoint/checkpoint_manager_impl.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace tandem {

using namespace detail;

namespace {

// Where resume() reads a tensor: plain pages, not the huge pages of the writer's staging buffers
// (host_buffer). On a VM that hands free huge pages back to its host, a fresh huge page costs a
// host fault: a 1 GiB resume took 1.2-1.5 s after the machine idled for 45 s, 0.35 s otherwise.
// verify_shard() maps the pages in bulk on the reading threads.
at::Tensor resume_buffer(const TensorRecord& r) {
  return at::empty(r.shape, at::TensorOptions().dtype(to_scalar_type(r.dtype)));
}

}  // namespace

// Sliced states: from every file of the checkpoint, the pieces each state wants (a rank reads only
// what overlaps its own slices, whatever world size wrote them); values from rank 0's file.
bool CheckpointManager::Impl::read_slices(const Manifest& m, int64_t step, Candidate* c) {
  for (const Entry& e : entries) {
    if (e.sharding != Sharding::kSliced) continue;
    auto* sliced = static_cast<SlicedCheckpointable*>(e.state.get());
    const std::string prefix = e.name + "/";
    StateDict& dict = c->states[e.name];
    for (const ManifestFile& file : m.files) {
      try {
        verify_shard(*fs, opts.directory, m, file, [&](const TensorRecord& r) -> void* {
          if (r.name.compare(0, prefix.size(), prefix) != 0) return nullptr;
          const std::string key = r.name.substr(prefix.size());
          if (!sliced->wants(key)) return nullptr;
          at::Tensor t = resume_buffer(r);
          dict.tensors.emplace_back(key, t);
          return t.data_ptr();
        }, /*only_destined=*/true);
      } catch (const CrashError&) {
        throw;
      } catch (const CheckpointError& err) {
        c->states.clear();
        c->status = Candidate::kInvalid;
        c->reason = strip_prefix(err.what());
        return false;
      }
      if (file.rank != 0) continue;
      for (const auto& [full, v] : file.values) {
        if (full.compare(0, prefix.size(), prefix) == 0) dict.values[full.substr(prefix.size())] = v;
      }
    }
  }
  return true;
}

CheckpointManager::Impl::Candidate CheckpointManager::Impl::evaluate(int64_t step) {
  Candidate c;
  const std::string where = step_directory(opts.directory, step);
  Manifest m;
  try {
    m = read_manifest(*fs, opts.directory, step);
  } catch (const CrashError&) {
    throw;
  } catch (const CheckpointError& e) {
    c.status = Candidate::kInvalid;
    c.reason = strip_prefix(e.what());
    return c;
  }
  const std::vector<Entry> wanted_entries = all_entries();
  std::map<std::string, const Entry*> wanted;
  for (const Entry& e : wanted_entries) {
    const ManifestState* ms = nullptr;
    for (const auto& s : m.states) {
      if (s.name == e.name) ms = &s;
    }
    if (ms == nullptr) {
      c.status = Candidate::kIncompatible;
      c.reason = where + " has no state \"" + e.name + "\" (registered here)";
      return c;
    }
    if (ms->kind != e.state->kind() || ms->sharding != e.sharding) {
      c.status = Candidate::kIncompatible;
      c.reason = where + ": state \"" + e.name + "\" is a " + sharding_name(ms->sharding) + " " +
                 ms->kind + " in the checkpoint but a " + sharding_name(e.sharding) + " " +
                 e.state->kind() + " here";
      return c;
    }
    wanted[e.name] = &e;
  }
  for (const auto& s : m.states) {
    if (wanted.count(s.name) == 0 && rank == 0) {
      warn(where + ": state \"" + s.name + "\" (" + s.kind + ") is not registered; it is not restored");
    }
  }
  const bool same_world = m.world_size == world;
  // Sliced states load at any world size (below); only per-rank states are bound to it.
  const bool any_per_rank = std::any_of(entries.begin(), entries.end(), [](const Entry& e) {
    return e.sharding == Sharding::kSharded;
  });
  bool skip_sharded = false;
  if (!same_world && any_per_rank) {
    std::string names;
    for (const auto& e : entries) {
      if (e.sharding == Sharding::kSharded) names += (names.empty() ? "" : ", ") + e.name;
    }
    if (opts.reshard == ReshardPolicy::kError) {
      c.status = Candidate::kIncompatible;
      c.reason = where + " was saved by " + std::to_string(m.world_size) + " ranks, this run has " +
                 std::to_string(world) + "; its sharded state (" + names +
                 ") cannot be resharded. Restart with " + std::to_string(m.world_size) +
                 " ranks, or restore only the replicated state: --set checkpoint.reshard=load_replicated_only "
                 "(CheckpointManagerOptions::reshard = ReshardPolicy::kLoadReplicatedOnly)";
      return c;
    }
    skip_sharded = true;
    if (rank == 0) {
      warn(where + " was saved by " + std::to_string(m.world_size) + " ranks, this run has " +
           std::to_string(world) + ": restoring replicated state only; sharded state (" + names +
           ") keeps its current values");
    }
  }
  // Files this rank needs: rank 0's (replicated state, and rank 0's sharded state), and its own.
  struct Need {
    const ManifestFile* file;
    bool replicated;  // take replicated states from it
    bool sharded;     // take this rank's sharded states from it
  };
  std::vector<Need> needs;
  const ManifestFile* f0 = m.file_of_rank(0);
  if (f0 == nullptr) {
    c.status = Candidate::kInvalid;
    c.reason = where + "/manifest.json lists no file for rank 0";
    return c;
  }
  needs.push_back({f0, true, rank == 0 && !skip_sharded});
  if (rank != 0 && !skip_sharded && any_per_rank) {
    const ManifestFile* fr = m.file_of_rank(rank);
    if (fr == nullptr) {
      c.status = Candidate::kInvalid;
      c.reason = where + "/manifest.json lists no file for rank " + std::to_string(rank) +
                 ", which holds sharded state";
      return c;
    }
    needs.push_back({fr, false, true});
  }
  for (const auto& e : wanted_entries) c.states[e.name];  // every registered state, even if empty
  for (const Need& need : needs) {
    auto take = [&](const std::string& full, std::string* state, std::string* key) {
      const auto slash = full.find('/');
      if (slash == std::string::npos) return false;
      *state = full.substr(0, slash);
      *key = full.substr(slash + 1);
      const auto it = wanted.find(*state);
      if (it == wanted.end()) return false;
      if (it->second->sharding == Sharding::kSliced) return false;  // read below
      const bool rep = it->second->sharding == Sharding::kReplicated;
      return rep ? need.replicated : need.sharded;
    };
    try {
      verify_shard(*fs, opts.directory, m, *need.file, [&](const TensorRecord& r) -> void* {
        std::string state, key;
        if (!take(r.name, &state, &key)) return nullptr;
        at::Tensor t = resume_buffer(r);
        c.states[state].tensors.emplace_back(key, t);
        return t.data_ptr();
      });
    } catch (const CrashError&) {
      throw;
    } catch (const CheckpointError& e) {
      c.states.clear();
      c.status = Candidate::kInvalid;
      c.reason = strip_prefix(e.what());
      return c;
    }
    for (const auto& [full, v] : need.file->values) {
      std::string state, key;
      if (take(full, &state, &key)) c.states[state].values[key] = v;
    }
  }
  if (!read_slices(m, step, &c)) return c;
  for (const auto& e : wanted_entries) {
    if (skip_sharded && e.sharding == Sharding::kSharded) {
      c.states.erase(e.name);
      continue;
    }
    const std::string why = e.state->check(c.states[e.name]);
    if (!why.empty()) {
      c.states.clear();
      c.status = Candidate::kIncompatible;
      c.reason = where + ": state \"" + e.name + "\" does not fit: " + strip_prefix(why);
      return c;
    }
  }
  c.status = Candidate::kValid;
  c.loaded = true;
  return c;
}

int64_t CheckpointManager::Impl::resume() {
  wait_idle();
  rethrow_error();
  StepListing listing;
  if (fs->exists(opts.directory)) listing = list_steps(*fs, opts.directory);
  if (rank == 0) {
    for (const auto& [path, why] : listing.uncommitted) warn("skipping checkpoint " + path + ": " + why);
  }
  std::map<int64_t, Candidate> seen;  // status per step; data kept only for the last one loaded
  auto status_of = [&](int64_t step) -> Candidate& {
    auto it = seen.find(step);
    if (it != seen.end() && (it->second.status != Candidate::kValid || it->second.loaded)) return it->second;
    for (auto& kv : seen) {  // keep one loaded checkpoint in memory at a time
      kv.second.states.clear();
      kv.second.loaded = false;
    }
    Candidate c = evaluate(step);
    if (c.status == Candidate::kInvalid) {
      warn("skipping checkpoint " + step_directory(opts.directory, step) + " on rank " +
           std::to_string(rank) + ": " + c.reason);
    }
    return seen[step] = std::move(c);
  };
  int64_t bound = std::numeric_limits<int64_t>::max();
  for (;;) {
    int64_t mine = -1;
    for (const int64_t s : listing.committed) {
      if (s > bound) continue;
      if (status_of(s).status != Candidate::kInvalid) {
        mine = s;
        break;
      }
    }
    const int64_t agreed = allreduce_int(mine, ReduceOp::kMin);
    if (agreed < 0) {
      resumed = -1;
      return 0;
    }
    Candidate& c = status_of(agreed);
    const int64_t code = c.status == Candidate::kValid ? 0 : c.status == Candidate::kInvalid ? 1 : 2;
    const int64_t worst = allreduce_int(code, ReduceOp::kMax);
    if (worst == 0) {
      for (const Entry& e : all_entries()) {
        const auto it = c.states.find(e.name);
        if (it != c.states.end()) e.state->load(it->second);
      }
      c.states.clear();
      resumed = agreed;
      return agreed;
    }
    if (worst == 2) {
      throw CheckpointError("tandem: checkpoint: cannot resume: " +
                            (code == 2 ? c.reason
                                       : step_directory(opts.directory, agreed) +
                                             " does not fit the registered state on another rank (see its error)") +
                            ". Fix the program or move that checkpoint away.",
                            /*restartable=*/false);  // every attempt would resume from it again
    }
    if (code == 0 && rank == 0) {
      warn("checkpoint " + step_directory(opts.directory, agreed) +
           " is invalid on another rank; falling back to an older one");
    }
    bound = agreed - 1;
  }
}

}  // namespace tandem
