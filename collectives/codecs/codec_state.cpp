#include "collectives/codecs/codec_state.h"

#include <tandem/base/errors.h>

#include <ATen/ops/add.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>

#include <cstdlib>

namespace tandem::detail {

ResidualBank::Layout& ResidualBank::layout_of(const GradBucket& bucket,
                                              const std::string& codec_name) {
  auto found = flats_.find(bucket.param_indices);
  if (found != flats_.end()) return found->second;
  // A new layout: drop the layouts that share a parameter with it (their views stay valid for
  // the copy below through residuals_).
  for (auto it = flats_.begin(); it != flats_.end();) {
    bool shared = false;
    for (int64_t p : it->first) {
      for (int64_t q : bucket.param_indices) shared = shared || p == q;
    }
    it = shared ? flats_.erase(it) : std::next(it);
  }
  Layout layout;
  layout.current = at::zeros({bucket.buffer.numel()}, bucket.buffer.options());
  for (size_t slot = 0; slot < bucket.param_indices.size(); ++slot) {
    const int64_t p = bucket.param_indices[slot];
    int64_t numel = 1;
    for (int64_t d : bucket.shapes[slot]) numel *= d;
    at::Tensor view = layout.current.narrow(0, bucket.offsets[slot], numel);
    auto old = residuals_.find(p);
    if (old != residuals_.end()) {
      if (old->second.numel() != view.numel()) {
        throw ConfigError("tandem: gradient codec '" + codec_name + "': the residual of parameter " +
                          std::to_string(p) + " holds " + std::to_string(old->second.numel()) +
                          " elements, but the parameter has " + std::to_string(view.numel()) +
                          ". The codec state comes from another model; resume with the model it "
                          "was saved with.");
      }
      view.copy_(old->second.reshape({-1}));
    }
    residuals_[p] = view;
  }
  return flats_.emplace(bucket.param_indices, std::move(layout)).first->second;
}

void ResidualBank::point(const std::vector<int64_t>& params, const Layout& layout) {
  // The views keep their offsets and sizes: re-slice the other buffer the same way.
  for (int64_t p : params) {
    const at::Tensor& view = residuals_.at(p);
    residuals_[p] = layout.current.narrow(0, view.storage_offset() -
                                                 layout.before.storage_offset(), view.numel());
  }
}

ResidualBank::Step ResidualBank::step(const GradBucket& bucket, int64_t step,
                                      const std::string& codec_name) {
  Layout& layout = layout_of(bucket, codec_name);
  if (!keep_undo_) {
    layout.step = step;
    layout.undoable = false;
    return {layout.current, layout.current};
  }
  // The residual before this step stays in `before`; the step writes the other buffer, whose
  // regions the codec never writes (uncompressed parameters) must agree with it from the start.
  if (!layout.before.defined()) layout.before = layout.current.clone();
  std::swap(layout.current, layout.before);
  layout.before_step = layout.step;
  layout.step = step;
  layout.undoable = true;
  point(bucket.param_indices, layout);
  return {layout.before, layout.current};
}

at::Tensor ResidualBank::accumulate(const GradBucket& bucket, const std::string& codec_name) {
  Step s = step(bucket, bucket.step, codec_name);
  return at::add_out(s.after, s.before, bucket.buffer);  // in place when no undo is kept
}

void ResidualBank::undo_from(int64_t step, const std::string& codec_name) {
  for (auto& [params, layout] : flats_) {
    if (layout.step < step) continue;
    if (!layout.undoable || layout.before_step >= step) {
      throw Error("tandem: gradient codec '" + codec_name + "': the error feedback before step " +
                  std::to_string(step) + " was not kept, so the aborted step cannot be undone. "
                  "This is a bug in tandem's fault tolerance; please report it.");
    }
    std::swap(layout.current, layout.before);
    layout.step = layout.before_step;
    layout.undoable = false;
    point(params, layout);
  }
}

void ResidualBank::load(int64_t param, at::Tensor residual) {
  flats_.clear();  // the next step() lays the loaded values out afresh
  residuals_[param] = std::move(residual);
}

namespace {

// "<param>" of "<codec>/<kind>/<param>": false when `name` is not of that form.
bool parse_state_name(const std::string& name, const std::string& codec, std::string* kind,
                      int64_t* param) {
  const std::string prefix = codec + "/";
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  const size_t slash = name.find('/', prefix.size());
  if (slash == std::string::npos || slash + 1 >= name.size()) return false;
  char* end = nullptr;
  const long long value = std::strtoll(name.c_str() + slash + 1, &end, 10);
  if (*end != '\0' || value < 0) return false;
  *kind = name.substr(prefix.size(), slash - prefix.size());
  *param = value;
  return true;
}

}  // namespace

std::map<std::string, at::Tensor> codec_state(const std::string& codec, const CodecStep* step,
                                              const std::map<std::string, const PerParam*>& kinds) {
  std::map<std::string, at::Tensor> out;
  if (step) out[codec + "/step"] = at::scalar_tensor(step->next(), at::kLong);
  for (const auto& [kind, tensors] : kinds) {
    for (const auto& [p, t] : *tensors) out[codec + "/" + kind + "/" + std::to_string(p)] = t;
  }
  return out;
}

void load_codec_state(const std::string& codec, const std::map<std::string, at::Tensor>& state,
                      CodecStep* step,
                      const std::map<std::string, std::function<void(int64_t, at::Tensor)>>& kinds) {
  for (const auto& [name, t] : state) {
    if (step && name == codec + "/step") {
      if (!t.defined() || t.numel() != 1 || t.scalar_type() != at::kLong) {
        throw ConfigError("tandem: codec state '" + name +
                          "' must be a single int64 (the codec's step counter); the checkpoint "
                          "is damaged or from another codec.");
      }
      step->load(t.reshape({}).item<int64_t>());
      continue;
    }
    std::string kind;
    int64_t param = 0;
    auto load = parse_state_name(name, codec, &kind, &param) ? kinds.find(kind) : kinds.end();
    if (load == kinds.end()) {
      throw ConfigError("tandem: gradient codec '" + codec + "' has no state named '" + name +
                        "'. The checkpoint was saved with another codec or codec settings; "
                        "configure the codec it was saved with to resume.");
    }
    load->second(param, t.clone());
  }
}

}  // namespace tandem::detail
