// PipelineParallel: what one schedule action does on this rank: forward (F), backward (B, or its
// input and weight halves I and W), sending and receiving activations and gradients, and the
// data-parallel gradient average after the step.
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>

#include "runtime/pipeline/pipeline_impl.h"

namespace tandem {

using pipeline::Action;
using pipeline::Op;
using namespace detail;

void PipelineParallel::Impl::release(Stage& st, int k) {
  auto it = st.live.find(k);
  st.held -= it->second.bytes;
  st.live.erase(it);
}

void PipelineParallel::Impl::forward(Stage& st, int k) {
  Micro mb;
  const int s = st.index;
  if (s == 0) {
    mb.input = micro_inputs[k];
  } else {
    mb.input = take_mail(0, s - 1, k).detach().requires_grad_(true);
  }
  mb.bytes = static_cast<int64_t>(mb.input.nbytes());
  at::Tensor h = mb.input;
  for (size_t l = 0; l < st.layers.size(); ++l) {
    const auto t0 = Clock::now();
    at::Tensor in = h;
    h = st.layers[l].module.forward(h);
    st.layer_forward[l] += seconds_between(t0, Clock::now());
    mb.bytes += static_cast<int64_t>(h.nbytes());
    if ((split_backward || st.all_linear) && !st.layers[l].params.empty() && h.requires_grad()) {
      mb.bounds.push_back(h);
      mb.bound_layers.push_back(static_cast<int>(l));
      mb.bound_inputs.push_back(in);
    }
  }
  if (s == S - 1) {
    at::Tensor loss = (*loss_fn)(h, micro_targets[k]);
    if (loss.numel() != 1) {
      throw ConfigError("PipelineParallel: the loss function must return a scalar, got " +
                        std::to_string(loss.numel()) + " elements");
    }
    if (options.reduction == LossReduction::kMean) loss = loss / static_cast<double>(M);
    mb.root = loss;
    step_loss = step_loss.defined() ? step_loss + loss.detach() : loss.detach().clone();
  } else {
    mb.root = h;
    mailbox[{0, s, k}] = h.detach().contiguous();
    if (rank_of(s + 1) != rank && !untagged) {
      post_recv(1, s + 1, k, at::empty(h.sizes(), h.options()));
    }
  }
  st.held += mb.bytes;
  st.peak = std::max(st.peak, st.held);
  st.live.emplace(k, std::move(mb));
}

void PipelineParallel::Impl::backward(Stage& st, int k, Op op) {
  const int s = st.index;
  Micro& mb = st.live.at(k);
  at::Tensor grad_out;
  if (s != S - 1 && op != Op::kBackwardWeight) grad_out = take_mail(1, s + 1, k);
  const bool has_input_grad = s > 0;
  // I: gradients of the stage input (sent on) and of every bound (kept for W), input path only.
  auto input_pass = [&] {
    std::vector<at::Tensor> want;
    if (has_input_grad) want.push_back(mb.input);
    std::vector<int> want_bound;  // index into bounds, -1 for the input
    if (has_input_grad) want_bound.push_back(-1);
    mb.bound_grads.assign(mb.bounds.size(), at::Tensor());
    for (size_t j = 0; j < mb.bounds.size(); ++j) {
      if (mb.bounds[j].unsafeGetTensorImpl() == mb.root.unsafeGetTensorImpl()) {
        mb.bound_grads[j] = grad_out;
      } else {
        want.push_back(mb.bounds[j]);
        want_bound.push_back(static_cast<int>(j));
      }
    }
    if (!want.empty() && mb.root.requires_grad()) {
      auto grads = torch::autograd::grad(
          {mb.root}, want,
          grad_out.defined() ? std::vector<at::Tensor>{grad_out} : std::vector<at::Tensor>{},
          /*retain_graph=*/true, /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t j = 0; j < grads.size(); ++j) {
        if (want_bound[j] < 0) {
          mailbox[{1, s, k}] = grads[j].defined() ? grads[j] : at::zeros_like(mb.input);
        } else {
          mb.bound_grads[want_bound[j]] = grads[j];
        }
      }
    } else if (has_input_grad) {
      mailbox[{1, s, k}] = at::zeros_like(mb.input);
    }
  };
  // W: weight gradients of every bound's layer from its output gradient.
  auto weight_pass = [&] {
    for (size_t j = 0; j < mb.bounds.size(); ++j) {
      if (!mb.bound_grads[j].defined()) continue;
      const Layer& layer = st.layers[mb.bound_layers[j]];
      if (layer.linear) {
        // By hand: autograd's weight-only pass also recomputes the input gradient of the layer
        // (measured: 2x the matmul time of this).
        at::NoGradGuard no_grad;
        auto& lin = *layer.linear;
        const at::Tensor x = mb.bound_inputs[j].detach().reshape({-1, lin.weight.size(1)});
        const at::Tensor g = mb.bound_grads[j].reshape({-1, lin.weight.size(0)});
        if (lin.weight.requires_grad()) {
          auto& wg = lin.weight.mutable_grad();
          if (wg.defined())
            wg.addmm_(g.t(), x);
          else
            wg = at::mm(g.t(), x);
        }
        if (lin.bias.defined() && lin.bias.requires_grad()) {
          auto& bg = lin.bias.mutable_grad();
          if (bg.defined())
            bg.add_(g.sum(0));
          else
            bg = g.sum(0);
        }
      } else {
        torch::autograd::backward({mb.bounds[j]}, {mb.bound_grads[j]}, /*retain_graph=*/true,
                                  /*create_graph=*/false, layer.params);
      }
    }
  };
  if (op == Op::kBackward && st.all_linear && !mb.bounds.empty()) {
    // Every parameter layer is a Linear: I + W by hand beats autograd's backward, whose Linear
    // weight gradient comes out transposed and is copied into .grad's layout (measured on
    // 4 x Linear(1024), 32 rows: B 10.4 ms vs I + W 7.9 ms).
    input_pass();
    weight_pass();
    release(st, k);
  } else if (op == Op::kBackward) {
    if (mb.root.requires_grad()) {
      torch::autograd::backward({mb.root}, grad_out.defined() ? std::vector<at::Tensor>{grad_out}
                                                              : std::vector<at::Tensor>{});
    }
    if (has_input_grad) {
      at::Tensor g = mb.input.grad();
      mailbox[{1, s, k}] = g.defined() ? g : at::zeros_like(mb.input);
    }
    release(st, k);
  } else if (op == Op::kBackwardInput) {
    input_pass();
  } else {  // W
    weight_pass();
    release(st, k);
  }
}

void PipelineParallel::Impl::run(const Action& a) {
  const int s = a.stage, k = a.microbatch;
  switch (a.op) {
    case Op::kForward:
      forward(stages.at(s), k);
      break;
    case Op::kBackward:
    case Op::kBackwardInput:
    case Op::kBackwardWeight:
      backward(stages.at(s), k, a.op);
      break;
    case Op::kSendForward:
    case Op::kSendBackward: {
      const int kind = a.op == Op::kSendForward ? 0 : 1;
      auto it = mailbox.find({kind, s, k});
      at::Tensor t = it->second.contiguous();
      mailbox.erase(it);
      const int peer = rank_of(kind == 0 ? s + 1 : s - 1);
      if (kind == 0 && send_meta) sender->send(longs(shape_message(t, s)), peer, tag(kind, s, k, 1));
      sender->send(t, peer, tag(kind, s, k, 0));
      break;
    }
    case Op::kRecvForward: {
      if (at::Tensor t = take_posted(0, s, k); t.defined()) {
        mailbox[{0, s, k}] = t;
        break;
      }
      const int peer = rank_of(s);
      auto cached = shape_cache.find({s, k});
      if (send_meta || cached == shape_cache.end()) {
        auto mt = at::empty({2 + kMaxDims}, at::kLong);
        comm->recv(mt, peer, tag(0, s, k, 1))->wait();
        const int64_t* m = mt.data_ptr<int64_t>();
        shape_cache[{s, k}] = {std::vector<int64_t>(m + 2, m + 2 + m[1]), m[0]};
        cached = shape_cache.find({s, k});
      }
      auto buf = at::empty(cached->second.first,
                           at::TensorOptions(static_cast<at::ScalarType>(cached->second.second))
                               .device(device));
      comm->recv(buf, peer, tag(0, s, k, 0))->wait();
      mailbox[{0, s, k}] = buf;
      break;
    }
    case Op::kRecvBackward: {
      // Posted when stage s-1 ran F for this microbatch (shaped like its output).
      at::Tensor t = take_posted(1, s, k);
      if (!t.defined()) {
        const at::Tensor& out = stages.at(s - 1).live.at(k).root;
        t = at::empty(out.sizes(), out.options());
        comm->recv(t, rank_of(s), tag(1, s, k, 0))->wait();
      }
      mailbox[{1, s, k}] = t;
      break;
    }
  }
}

std::vector<int64_t> PipelineParallel::Impl::shape_message(const at::Tensor& t, int stage) {
  if (t.dim() > kMaxDims) {
    throw ConfigError("PipelineParallel: stage " + std::to_string(stage) + " output has " +
                      std::to_string(t.dim()) + " dimensions, at most " +
                      std::to_string(kMaxDims) + " are supported");
  }
  std::vector<int64_t> meta(2 + kMaxDims, 0);
  meta[0] = static_cast<int64_t>(t.scalar_type());
  meta[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) meta[2 + d] = t.size(d);
  return meta;
}

at::Tensor PipelineParallel::Impl::take_mail(int kind, int stage, int k) {
  auto it = mailbox.find({kind, stage, k});
  at::Tensor t = std::move(it->second);
  mailbox.erase(it);
  if (auto arriving_it = arriving.find({kind, stage, k}); arriving_it != arriving.end()) {
    arriving_it->second->wait();  // the batch that brings it: a stream wait on NCCL
    arriving.erase(arriving_it);
  }
  return t;
}

void PipelineParallel::Impl::add_to_batch(const Action& a, bool last) {
  batch.push_back(a);
  if (last) post_batch();
}

void PipelineParallel::Impl::post_batch() {
  // With shapes to learn, each op goes alone, in order, an activation's shape right before it: a
  // receive reads its shape on the host before its buffer exists. lower_untagged()'s one global
  // order keeps that deadlock-free without groups, and a pair's messages in one order.
  if (send_meta) {
    for (const Action& a : batch) post_ops({a});
  } else {
    post_ops(batch);
  }
  batch.clear();
}

void PipelineParallel::Impl::post_ops(const std::vector<Action>& actions) {
  const at::TensorOptions longs_here = at::TensorOptions(at::kLong).device(device);
  std::vector<P2POp> ops;
  std::vector<std::tuple<int, int, int>> received;
  for (const Action& a : actions) {
    const int s = a.stage, k = a.microbatch, peer = peer_of(a);
    if (a.op == Op::kSendForward || a.op == Op::kSendBackward) {
      const int kind = a.op == Op::kSendForward ? 0 : 1;
      auto it = mailbox.find({kind, s, k});
      at::Tensor t = it->second.contiguous();
      mailbox.erase(it);
      if (kind == 0 && send_meta) {
        at::Tensor shape = longs(shape_message(t, s)).to(longs_here);
        in_flight.emplace_back(comm->send_recv({{P2POp::Kind::kSend, shape, peer}}),
                               std::vector<at::Tensor>{shape});
      }
      ops.push_back({P2POp::Kind::kSend, std::move(t), peer});
      continue;
    }
    at::Tensor buffer;
    if (a.op == Op::kRecvForward) {
      if (send_meta) {
        const at::Tensor shape = at::empty({2 + kMaxDims}, longs_here);
        comm->send_recv({{P2POp::Kind::kRecv, shape, peer}})->wait();
        const at::Tensor host = shape.cpu();  // the host reads it: waits for it
        const int64_t* v = host.data_ptr<int64_t>();
        shape_cache[{s, k}] = {std::vector<int64_t>(v + 2, v + 2 + v[1]), v[0]};
      }
      const auto& [sizes, dtype] = shape_cache.at({s, k});
      buffer = at::empty(sizes, at::TensorOptions(static_cast<at::ScalarType>(dtype)).device(device));
    } else {  // RECV_B: shaped as this rank's own output
      const at::Tensor& out = stages.at(s - 1).live.at(k).root;
      buffer = at::empty(out.sizes(), out.options());
    }
    const int kind = a.op == Op::kRecvForward ? 0 : 1;
    ops.push_back({P2POp::Kind::kRecv, buffer, peer});
    mailbox[{kind, s, k}] = buffer;
    received.emplace_back(kind, s, k);
  }
  WorkPtr work = comm->send_recv(ops);
  for (const auto& key : received) arriving[key] = work;
  std::vector<at::Tensor> tensors;
  for (const P2POp& op : ops) tensors.push_back(op.tensor);
  in_flight.emplace_back(std::move(work), std::move(tensors));
}

void PipelineParallel::Impl::reduce_data_parallel() {
  if (!data) return;
  for (auto& [s, st] : stages) {
    std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
    for (auto& p : st.module->parameters()) {
      if (!p.requires_grad()) continue;
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      by_dtype[p.scalar_type()].push_back(p.grad());
    }
    for (auto& [dtype, grads] : by_dtype) {
      std::vector<at::Tensor> flat;
      for (const auto& g : grads) flat.push_back(g.reshape({-1}));
      auto buffer = at::cat(flat);
      data->allreduce(buffer, ReduceOp::kAvg)->wait();
      int64_t off = 0;
      at::NoGradGuard no_grad;
      for (auto& g : grads) {
        g.copy_(buffer.narrow(0, off, g.numel()).view(g.sizes()));
        off += g.numel();
      }
    }
  }
}

}  // namespace tandem
