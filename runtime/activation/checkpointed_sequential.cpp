// ActivationCheckpointPolicy and CheckpointedSequential (include/tandem/runtime/activation_checkpoint.h):
// cut a torch::nn::Sequential into runs of modules and run each checkpointed run through
// tandem::checkpoint with its modules' parameters declared.
#include <tandem/runtime/activation_checkpoint.h>

#include <torch/nn/modules/container/any.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_set>

namespace tandem {

ActivationCheckpointPolicy ActivationCheckpointPolicy::none() {
  return ActivationCheckpointPolicy();
}

ActivationCheckpointPolicy ActivationCheckpointPolicy::segments(std::int64_t n) {
  if (n < 1) {
    throw ConfigError("tandem: ActivationCheckpointPolicy::segments(" + std::to_string(n) +
                      "): the number of segments must be at least 1.");
  }
  ActivationCheckpointPolicy p;
  p.kind_ = Kind::kSegments;
  p.n_ = n;
  return p;
}

ActivationCheckpointPolicy ActivationCheckpointPolicy::every(std::int64_t k) {
  if (k < 1) {
    throw ConfigError("tandem: ActivationCheckpointPolicy::every(" + std::to_string(k) +
                      "): the number of modules per checkpoint must be at least 1.");
  }
  ActivationCheckpointPolicy p;
  p.kind_ = Kind::kEvery;
  p.n_ = k;
  return p;
}

ActivationCheckpointPolicy ActivationCheckpointPolicy::sqrt() {
  ActivationCheckpointPolicy p;
  p.kind_ = Kind::kSqrt;
  return p;
}

ActivationCheckpointPolicy ActivationCheckpointPolicy::select(Picker pick) {
  if (!pick) {
    throw ConfigError(
        "tandem: ActivationCheckpointPolicy::select: the picker is empty; pass a callable "
        "bool(const std::string& name, const torch::nn::Module& module).");
  }
  ActivationCheckpointPolicy p;
  p.kind_ = Kind::kSelect;
  p.pick_ = std::move(pick);
  return p;
}

std::vector<ActivationCheckpointSegment> ActivationCheckpointPolicy::plan(
    const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& children) const {
  const std::size_t n = children.size();
  std::vector<ActivationCheckpointSegment> out;
  if (n == 0) return out;
  if (kind_ == Kind::kNone) return {{0, n, false}};
  if (kind_ == Kind::kSelect) {
    std::size_t plain_begin = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!pick_(children[i].first, *children[i].second)) continue;
      if (plain_begin < i) out.push_back({plain_begin, i, false});
      out.push_back({i, i + 1, true});
      plain_begin = i + 1;
    }
    if (plain_begin < n) out.push_back({plain_begin, n, false});
    return out;
  }
  std::size_t runs = 1;
  if (kind_ == Kind::kSegments) {
    runs = static_cast<std::size_t>(n_);
  } else if (kind_ == Kind::kSqrt) {
    runs = static_cast<std::size_t>(std::llround(std::sqrt(static_cast<double>(n))));
  } else {  // kEvery
    runs = (n + static_cast<std::size_t>(n_) - 1) / static_cast<std::size_t>(n_);
  }
  runs = std::max<std::size_t>(1, std::min(runs, n));
  std::size_t begin = 0;
  for (std::size_t r = 0; r < runs; ++r) {
    std::size_t len;
    if (kind_ == Kind::kEvery) {
      len = std::min(static_cast<std::size_t>(n_), n - begin);
    } else {
      len = n / runs + (r < n % runs ? 1 : 0);
    }
    out.push_back({begin, begin + len, true});
    begin += len;
  }
  if (!checkpoint_last_) out.back().checkpointed = false;
  return out;
}

std::string ActivationCheckpointPolicy::describe() const {
  std::string s;
  switch (kind_) {
    case Kind::kNone: return "none";
    case Kind::kSegments: s = "segments(" + std::to_string(n_) + ")"; break;
    case Kind::kEvery: s = "every(" + std::to_string(n_) + ")"; break;
    case Kind::kSqrt: s = "sqrt"; break;
    case Kind::kSelect: return "select";
  }
  return checkpoint_last_ ? s + "+last" : s;
}

CheckpointedSequentialImpl::CheckpointedSequentialImpl(torch::nn::Sequential sequential,
                                                       ActivationCheckpointPolicy policy,
                                                       ActivationCheckpointOptions options)
    : sequential_(std::move(sequential)), policy_(std::move(policy)), options_(std::move(options)) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> children;
  for (const auto& item : sequential_->named_children()) {
    children.emplace_back(item.key(), item.value());
    register_module(item.key(), item.value());
  }
  segments_ = policy_.plan(children);
  options_.parameters.reset();
}

at::Tensor CheckpointedSequentialImpl::forward(const at::Tensor& input) {
  at::Tensor x = input;
  auto modules = sequential_->begin();
  const std::size_t count = segments_.size();
  for (std::size_t s = 0; s < count; ++s) {
    const ActivationCheckpointSegment seg = segments_[s];
    if (!seg.checkpointed) {
      for (std::size_t i = seg.begin; i < seg.end; ++i) x = modules[i].forward<at::Tensor>(x);
      continue;
    }
    ActivationCheckpointOptions opts = options_;
    opts.name = options_.name + " segment " + std::to_string(s + 1) + " of " +
                std::to_string(count) + " (modules " + std::to_string(seg.begin) + ".." +
                std::to_string(seg.end - 1) + ")";
    std::vector<at::Tensor> params;
    std::unordered_set<const void*> seen;
    for (std::size_t i = seg.begin; i < seg.end; ++i) {
      for (const auto& p : modules[i].ptr()->parameters()) {
        if (seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
      }
    }
    opts.parameters = std::move(params);
    // The Sequential (a shared holder) keeps the modules alive as long as the graph needs them.
    torch::nn::Sequential seq = sequential_;
    const std::size_t begin = seg.begin, end = seg.end;
    x = activation_checkpoint(
        ActivationCheckpointFunction([seq, begin, end](const std::vector<at::Tensor>& in) mutable {
          auto mods = seq->begin();
          at::Tensor h = in[0];
          for (std::size_t i = begin; i < end; ++i) h = mods[i].forward<at::Tensor>(h);
          return std::vector<at::Tensor>{h};
        }),
        {x}, std::move(opts))[0];
  }
  return x;
}

std::string CheckpointedSequentialImpl::describe() const {
  std::ostringstream os;
  os << policy_.describe() << ": " << segments_.size() << " run" << (segments_.size() == 1 ? "" : "s")
     << ":";
  for (std::size_t s = 0; s < segments_.size(); ++s) {
    os << (s ? ", " : " ") << "[" << segments_[s].begin << "," << segments_[s].end << ") "
       << (segments_[s].checkpointed ? "ckpt" : "plain");
  }
  return os.str();
}

}  // namespace tandem
