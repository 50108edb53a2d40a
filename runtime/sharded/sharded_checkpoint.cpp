// ShardedDataParallel in training-state checkpoints: each rank saves its slices of every
// parameter and of the optimizer state, keyed by the parameter's name and flattened range, so a
// checkpoint loads at any world size and stage (DCP cannot reshard optimizer state:
// pytorch#91205). Each rank reads back only the pieces that overlap its own slices.
#include "runtime/sharded/sharded_state.h"

#include <tandem/base/errors.h>
#include <tandem/checkpoint/checkpoint_manager.h>

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/optimizer.h>

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <regex>

namespace tandem {

using State = ShardedDataParallelCore::State;

namespace {

using Slice = ShardedDataParallelCore::ParameterSlice;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ",") + std::to_string(d);
  return s;
}

// This rank's slices of globals "<prefix><parameter name>", with the pieces a load offers.
class SliceSet {
 public:
  void add(const std::string& global, const Slice& slice) { mine_[global] = slice; }

  bool wants(const std::string& key) const {
    std::string global;
    int64_t b = 0, e = 0;
    if (!parse_slice_key(key, &global, &b, &e)) return false;
    auto it = mine_.find(global);
    return it != mine_.end() && b < it->second.end && it->second.begin < e;
  }

  // Why `loaded` does not cover this rank's slices, or "".
  std::string check(const StateDict& loaded) const {
    std::map<std::string, int64_t> covered;
    for (const auto& [key, t] : loaded.tensors) {
      std::string global;
      int64_t b = 0, e = 0;
      if (!parse_slice_key(key, &global, &b, &e)) return "\"" + key + "\" is not a slice key";
      auto it = mine_.find(global);
      if (it == mine_.end()) continue;
      if (t.numel() != e - b || t.scalar_type() != it->second.dtype) {
        return "piece \"" + key + "\" is " + detail::describe_tensor(t) + ", expected " +
               std::to_string(e - b) + " elements of " + c10::toString(it->second.dtype);
      }
      const int64_t total = std::accumulate(it->second.shape.begin(), it->second.shape.end(),
                                                int64_t{1}, std::multiplies<int64_t>());
      if (e > total) {
        return "piece \"" + key + "\" runs past the " + std::to_string(total) + " elements of '" +
               it->second.name + "' here (saved from another model)";
      }
      covered[global] += std::min(e, it->second.end) - std::max(b, it->second.begin);
    }
    for (const auto& [global, s] : mine_) {
      if (covered[global] != s.end - s.begin) {
        return "the checkpoint's pieces of \"" + global + "\" cover " +
               std::to_string(covered[global]) + " of the " + std::to_string(s.end - s.begin) +
               " elements [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
               ") this rank needs: its sharding cannot be mapped onto this model (saved from "
               "another model, or pieces missing)";
      }
    }
    return "";
  }

  // Copies the overlap of every loaded piece into `dst(global)` (this rank's slice of it).
  template <class Dst>
  void scatter(const StateDict& loaded, Dst dst) const {
    torch::autograd::AutoGradMode no_grad(false);
    for (const auto& [key, t] : loaded.tensors) {
      std::string global;
      int64_t b = 0, e = 0;
      if (!parse_slice_key(key, &global, &b, &e)) continue;
      auto it = mine_.find(global);
      if (it == mine_.end()) continue;
      const int64_t lo = std::max(b, it->second.begin), hi = std::min(e, it->second.end);
      if (lo >= hi) continue;
      at::Tensor target = dst(global);
      target.narrow(0, lo - it->second.begin, hi - lo).copy_(t.narrow(0, lo - b, hi - lo));
    }
  }

  const std::map<std::string, Slice>& mine() const { return mine_; }

 private:
  std::map<std::string, Slice> mine_;
};

// Parameters: "<name>#<begin>-<end>"; rank 0 also records every shape ("shape:<name>").
class ParameterSlices final : public SlicedCheckpointable {
 public:
  explicit ParameterSlices(ShardedDataParallelCore& core) : core_(core) {}
  std::string kind() const override { return "sharded-parameters"; }

  StateDict state_dict() override { return pieces(false); }
  StateDict own_state() override { return pieces(true); }
  bool wants(const std::string& key) override {
    refresh();
    return set_.wants(key);
  }
  // The whole model against the whole checkpoint (rank 0 saved every parameter's shape), in name
  // order, so every rank finds the same first difference whatever slices it holds.
  std::string check(const StateDict& loaded) override {
    refresh();
    std::map<std::string, std::string> saved;  // name -> shape text
    for (const auto& [key, v] : loaded.values) {
      if (key.rfind("shape:", 0) != 0) continue;
      saved[key.substr(6)] = std::holds_alternative<std::string>(v) ? std::get<std::string>(v)
                                                                    : describe_value(v);
    }
    std::map<std::string, std::string> here;
    for (const auto& s : core_.parameter_slices()) here[s.name] = shape_text(s.shape);
    const std::string counts = " (" + std::to_string(saved.size()) + " parameters in the "
                               "checkpoint, " + std::to_string(here.size()) + " in this model)";
    for (const auto& [name, shape] : here) {
      auto it = saved.find(name);
      if (it == saved.end()) return "the checkpoint has no parameter '" + name + "'" + counts;
      if (it->second != shape) {
        return "parameter '" + name + "' has shape [" + it->second + "] in the checkpoint, [" +
               shape + "] here";
      }
    }
    for (const auto& [name, shape] : saved) {
      if (!here.count(name)) {
        return "the checkpoint has parameter '" + name + "' [" + shape +
               "], which this model lacks" + counts + ": it was saved from another model";
      }
    }
    return set_.check(loaded);
  }
  void load(const StateDict& loaded) override {
    refresh();
    set_.scatter(loaded, [&](const std::string& global) { return set_.mine().at(global).data; });
  }

 private:
  // For a checkpoint, hybrid sharding's first group writes the pieces (the groups hold identical
  // ones) and rank 0 the shapes; `own`: everything this rank holds, as a peer needs it.
  StateDict pieces(bool own) {
    refresh();
    const auto& rep = core_.internal_state().replicate_comm;
    const bool writes = own || !rep || rep->rank() == 0;
    const bool shapes = own || core_.internal_state().world->rank() == 0;
    StateDict d;
    for (const auto& s : core_.parameter_slices()) {
      if (writes && s.end > s.begin) d.tensors.emplace_back(slice_key(s.name, s.begin, s.end), s.data);
      if (shapes) d.values["shape:" + s.name] = shape_text(s.shape);
    }
    return d;
  }
  void refresh() {
    set_ = SliceSet();
    for (const auto& s : core_.parameter_slices()) {
      if (s.end > s.begin) set_.add(s.name, s);
    }
  }

  ShardedDataParallelCore& core_;
  SliceSet set_;
};

// Optimizer state over parameters(): each per-shard tensor ("g0.p3.exp_avg", unit 3's slice) is
// saved as pieces of "<field>:<parameter name>"; per-shard values ("g0.p3.step") as
// "<value>:<parameter name>" for every parameter of the unit (rank 0's file); group options as
// they are. Loading assembles the optimizer's own state dict for this rank's shards.
class OptimizerSlices final : public SlicedCheckpointable {
 public:
  OptimizerSlices(ShardedDataParallelCore& core, torch::optim::Optimizer& opt, const std::string& name)
      : core_(core), opt_(opt), inner_(detail::optimizer_state(opt, name)) {
    core_.check_optimizer_parameters(all_params());
  }
  std::string kind() const override { return "sharded-" + inner_->kind(); }
  bool changes_only_in_optimizer_step() const override { return true; }

  StateDict state_dict() override { return pieces(false); }
  StateDict own_state() override { return pieces(true); }

  bool wants(const std::string& key) override {
    std::string global;
    int64_t b = 0, e = 0;
    if (!parse_slice_key(key, &global, &b, &e)) return false;
    const auto colon = global.find(':');
    if (colon == std::string::npos) return false;
    return slices().wants(slice_key(global.substr(colon + 1), b, e));
  }

  std::string check(const StateDict& loaded) override {
    StateDict assembled;
    const std::string why = assemble(loaded, &assembled);
    return why.empty() ? inner_->check(assembled) : why;
  }

  void load(const StateDict& loaded) override {
    StateDict assembled;
    assemble(loaded, &assembled);
    inner_->load(assembled);
  }

 private:
  // `own`: every piece this rank holds; otherwise hybrid sharding's first group writes them.
  StateDict pieces(bool own) {
    const StateDict inner = inner_->state_dict();
    StateDict d;
    const auto units = unit_of_index();
    static const std::regex per_shard(R"(g(\d+)\.p(\d+)\.(.+))");
    std::smatch m;
    for (const auto& [key, v] : inner.values) {
      if (!std::regex_match(key, m, per_shard)) {
        d.values[key] = v;
        continue;
      }
      for (const auto& p : units.at(key_of(m)).param_names) d.values[m[3].str() + ":" + p] = v;
    }
    const auto& rep = core_.internal_state().replicate_comm;
    const bool writes = own || !rep || rep->rank() == 0;
    for (const auto& [key, t] : inner.tensors) {
      if (!writes || !std::regex_match(key, m, per_shard)) continue;
      for (const auto& s : core_.unit_slices(units.at(key_of(m)).index, t)) {
        if (s.end > s.begin) d.tensors.emplace_back(slice_key(m[3].str() + ":" + s.name, s.begin, s.end), s.data);
      }
    }
    return d;
  }

  struct UnitInfo {
    size_t index = 0;                      // position in parameters()
    std::vector<std::string> param_names;  // the unit's parameters
  };

  std::vector<at::Tensor> all_params() const {
    std::vector<at::Tensor> ps;
    for (const auto& g : opt_.param_groups()) ps.insert(ps.end(), g.params().begin(), g.params().end());
    return ps;
  }
  static std::string key_of(const std::smatch& m) { return "g" + m[1].str() + ".p" + m[2].str(); }

  // "g<g>.p<i>" -> the unit of that optimizer parameter.
  std::map<std::string, UnitInfo> unit_of_index() const {
    const std::vector<at::Tensor> shards = core_.parameters();
    const auto slices = core_.parameter_slices();
    std::map<std::string, UnitInfo> out;
    const auto& groups = opt_.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t i = 0; i < groups[g].params().size(); ++i) {
        UnitInfo info;
        for (size_t u = 0; u < shards.size(); ++u) {
          if (shards[u].is_same(groups[g].params()[i])) info.index = u;
        }
        info.param_names = core_.unit_parameter_names(info.index);
        out["g" + std::to_string(g) + ".p" + std::to_string(i)] = info;
      }
    }
    return out;
  }

  SliceSet slices() const {
    SliceSet set;
    for (const auto& s : core_.parameter_slices()) {
      if (s.end > s.begin) set.add(s.name, s);
    }
    return set;
  }

  std::string assemble(const StateDict& loaded, StateDict* out) {
    const auto units = unit_of_index();
    static const std::regex per_param(R"((.+?):(.+))");
    std::smatch m;
    // Values: group options as saved; per-shard values from the unit's first parameter.
    std::map<std::string, std::map<std::string, CheckpointValue>> by_param;
    for (const auto& [key, v] : loaded.values) {
      if (std::regex_match(key, m, per_param)) {
        by_param[m[2].str()][m[1].str()] = v;
      } else {
        out->values[key] = v;
      }
    }
    // Per-shard entries are keyed by parameter name, so the unit layout may differ from the
    // saving run's (another stage or bucket size): only the group count must match.
    const auto& groups = opt_.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      out->values["g" + std::to_string(g) + ".params"] = static_cast<int64_t>(groups[g].params().size());
    }
    const std::vector<at::Tensor> shards = core_.parameters();
    for (const auto& [index_key, info] : units) {
      const auto it = info.param_names.empty() ? by_param.end() : by_param.find(info.param_names.front());
      if (it == by_param.end()) {
        return "the checkpoint's optimizer state has nothing for parameter '" +
               (info.param_names.empty() ? std::string("?") : info.param_names.front()) +
               "': saved from another model or optimizer";
      }
      for (const auto& [field, v] : it->second) out->values[index_key + "." + field] = v;
      // Tensors: this rank's slice of every field saved for the unit's parameters.
      std::map<std::string, at::Tensor> fields;
      for (const auto& [key, t] : loaded.tensors) {
        std::string global;
        int64_t b = 0, e = 0;
        if (!parse_slice_key(key, &global, &b, &e) || !std::regex_match(global, m, per_param)) continue;
        if (std::find(info.param_names.begin(), info.param_names.end(), m[2].str()) == info.param_names.end()) continue;
        // Assembled in host memory from the (host) pieces; the optimizer adapter's load then moves
        // each field once onto its parameter's device and dtype (checkpoint/optimizer_state.cpp).
        if (!fields.count(m[1].str())) fields[m[1].str()] = at::zeros({shards[info.index].numel()}, t.options());
      }
      for (auto& [field, target] : fields) {
        StateDict pieces;
        SliceSet set;
        for (const auto& s : core_.unit_slices(info.index, target)) {
          if (s.end > s.begin) set.add(field + ":" + s.name, s);
        }
        for (const auto& [key, t] : loaded.tensors) {
          std::string global;
          int64_t b = 0, e = 0;
          if (parse_slice_key(key, &global, &b, &e) && set.mine().count(global)) pieces.tensors.emplace_back(key, t);
        }
        const std::string why = set.check(pieces);
        if (!why.empty()) return why;
        set.scatter(pieces, [&](const std::string& global) { return set.mine().at(global).data; });
        out->tensors.emplace_back(index_key + "." + field, target);
      }
    }
    return "";
  }

  ShardedDataParallelCore& core_;
  torch::optim::Optimizer& opt_;
  std::shared_ptr<Checkpointable> inner_;
};

}  // namespace

void ShardedDataParallelCore::register_checkpoint(CheckpointManager& ckpt, const std::string& name) {
  ckpt.add(name, std::make_shared<ParameterSlices>(*this), Sharding::kSliced);
  // Buffers and frozen parameters are replicated: rank 0 writes them once.
  State& s = *state_;
  ckpt.add_tensors(
      name + "_buffers",
      [&s] {
        std::map<std::string, at::Tensor> t;
        for (size_t i = 0; i < s.buffers.size(); ++i) t["buffer:" + s.buffer_names[i]] = s.buffers[i];
        for (auto& item : s.module->named_parameters()) {
          if (!item.value().requires_grad()) t["frozen:" + item.key()] = item.value();
        }
        return t;
      },
      [&s](const std::map<std::string, at::Tensor>& loaded) {
        torch::autograd::AutoGradMode no_grad(false);
        for (size_t i = 0; i < s.buffers.size(); ++i) {
          auto it = loaded.find("buffer:" + s.buffer_names[i]);
          if (it != loaded.end()) s.buffers[i].copy_(it->second);
        }
        for (auto& item : s.module->named_parameters()) {
          auto it = loaded.find("frozen:" + item.key());
          if (!item.value().requires_grad() && it != loaded.end()) item.value().copy_(it->second);
        }
      },
      Sharding::kReplicated);
}

void ShardedDataParallelCore::register_optimizer(CheckpointManager& ckpt, const std::string& name,
                                                 torch::optim::Optimizer& optimizer) {
  ckpt.add(name, std::make_shared<OptimizerSlices>(*this, optimizer, name), Sharding::kSliced);
}

std::vector<std::string> ShardedDataParallelCore::unit_parameter_names(size_t shard_index) const {
  size_t next = 0;
  for (const auto& u : state_->units) {
    if (u.numel == 0) continue;
    if (next++ != shard_index) continue;
    std::vector<std::string> names;
    for (int64_t p : u.params) names.push_back(state_->names[p]);
    return names;
  }
  return {};
}

}  // namespace tandem
