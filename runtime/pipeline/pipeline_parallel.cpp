// PipelineParallel: construction (partitioning, agreement across ranks) and the step
// (pipeline_parallel.h). The actions a step runs are in pipeline_actions.cpp.
#include <ATen/ops/empty.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "runtime/pipeline/pipeline_impl.h"

#include <tandem/base/trace.h>
#include <tandem/checkpoint/checkpoint_manager.h>

namespace tandem {

using pipeline::Action;
using pipeline::Op;
using namespace detail;

void PipelineParallel::Impl::partition(torch::nn::Sequential& model) {
  const int n = static_cast<int>(model->size());
  num_layers = n;
  if (!options.balance.empty()) {
    balance = options.balance;
    return;  // checked (on every rank together) in agree_at_construction
  }
  std::vector<double> weights(n, 0.0);
  if (options.partition == Partition::kParameters) {
    for (int i = 0; i < n; ++i) {
      for (const auto& p : model->ptr(i)->parameters())
        weights[i] += static_cast<double>(p.numel());
      weights[i] += 1e-9;  // parameter-free layers still cost something
    }
  } else {
    if (!options.profile_input.defined()) {
      throw ConfigError(
          "Partition::kProfile needs PipelineOptions::profile_input (a sample batch)");
    }
    at::NoGradGuard no_grad;
    for (int rep = 0; rep < 3; ++rep) {
      at::Tensor h = options.profile_input;
      for (int i = 0; i < n; ++i) {
        const auto t0 = Clock::now();
        h = (model->begin() + i)->forward(h);
        const double dt = seconds_between(t0, Clock::now());
        weights[i] = rep == 0 ? dt : std::min(weights[i], dt);
      }
    }
    // Every rank measured; the sum over ranks is the same bits everywhere.
    weights = allreduce_doubles(*comm, weights);
  }
  balance = partition_balanced(weights, S);
}

void PipelineParallel::Impl::agree_at_construction(const std::string& local_error) {
  const uint64_t balance_xxh3 = XXH3_64bits(balance.data(), balance.size() * sizeof(int64_t));
  int64_t balance_hash = 0;
  std::memcpy(&balance_hash, &balance_xxh3, sizeof(balance_hash));
  int64_t fp = 0;
  const uint64_t f = local_error.empty() ? schedule.fingerprint() : 0;
  std::memcpy(&fp, &f, sizeof(fp));
  const std::vector<int64_t> mine = {
      local_error.empty() ? 0 : 1,          comm->size(), S, num_layers,
      static_cast<int64_t>(balance.size()), balance_hash, M, fp};
  const size_t w = mine.size();
  const auto all = allgather_longs(*comm, mine);
  auto describe = [&](int r) {
    const int64_t* v = &all[r * w];
    std::ostringstream o;
    o << "rank " << r << ": " << v[2] << " stages, " << v[3] << " layers, balance of " << v[4]
      << " stages (hash " << std::hex << v[5] << std::dec << "), " << v[6]
      << " microbatches, schedule fingerprint " << std::hex << static_cast<uint64_t>(v[7]);
    return o.str();
  };
  if (!local_error.empty()) throw ConfigError(local_error);
  for (int r = 0; r < comm->size(); ++r) {
    if (all[r * w] != 0) {
      throw ConfigError("pipeline rank " + std::to_string(r) +
                        " could not set up its pipeline (see its error); nothing was run");
    }
  }
  for (int r = 0; r < comm->size(); ++r) {
    if (!std::equal(all.begin() + r * w, all.begin() + (r + 1) * w, all.begin())) {
      std::ostringstream msg;
      msg << "pipeline ranks disagree on the schedule, microbatches, stage count or balance:\n  "
          << describe(0) << "\n  " << describe(r)
          << "\nevery rank must build the same schedule (same PipelineOptions and model)";
      throw ConfigError(msg.str());
    }
  }
}

PipelineParallel::PipelineParallel(torch::nn::Sequential model,
                                   std::shared_ptr<Communicator> pipeline_comm,
                                   PipelineOptions options, std::shared_ptr<Communicator> data)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  if (!pipeline_comm) throw ConfigError("PipelineParallel: the pipeline communicator is null");
  I.comm = std::move(pipeline_comm);
  I.data = std::move(data);
  I.options = std::move(options);
  I.rank = I.comm->rank();
  I.sender = std::make_unique<detail::SendThread>(I.comm);
  const int p = I.comm->size();
  std::string error;
  try {
    if (I.options.custom_schedule) {
      I.schedule = *I.options.custom_schedule;
    } else {
      I.schedule = pipeline::build_schedule(I.options.schedule, p, I.options.num_microbatches,
                                            I.options.virtual_stages);
    }
    pipeline::validate(I.schedule);
    // Without tags the sends and receives go where lower_untagged() puts them (also for a lowered
    // schedule of the user's: its placement suits tags); an error only at such a step.
    try {
      I.untagged_schedule = pipeline::lower_untagged(I.schedule);
      pipeline::validate_untagged(I.untagged_schedule);
    } catch (const pipeline::ScheduleError& e) {
      I.untagged_error = e.what();
    }
    I.schedule = pipeline::lower(I.schedule);
    if (I.schedule.num_ranks != p) {
      throw ConfigError("schedule '" + I.schedule.name + "' is for " +
                        std::to_string(I.schedule.num_ranks) + " ranks, the pipeline group has " +
                        std::to_string(p));
    }
    I.S = I.schedule.num_stages;
    I.M = I.schedule.num_microbatches;
    I.partition(model);
    if (static_cast<int>(I.balance.size()) != I.S) {
      throw ConfigError("balance has " + std::to_string(I.balance.size()) +
                        " entries, the schedule has " + std::to_string(I.S) + " stages");
    }
    int64_t total = 0;
    for (int64_t b : I.balance) {
      if (b < 1)
        throw ConfigError("every pipeline stage needs at least one layer (balance entry " +
                          std::to_string(b) + ")");
      total += b;
    }
    if (total != I.num_layers) {
      throw ConfigError("balance sums to " + std::to_string(total) + " layers, the model has " +
                        std::to_string(I.num_layers));
    }
  } catch (const Error& e) {
    error = e.what();
  }
  I.agree_at_construction(error);
  if (I.untagged_error.empty()) {
    I.batch_end.assign(I.untagged_schedule.actions[I.rank].size(), false);
    const auto batches = pipeline::untagged_batches(I.untagged_schedule);
    for (const auto& batch : batches[I.rank]) I.batch_end[batch.back()] = true;
  }

  // Keep only this rank's layers.
  int64_t first = 0;
  for (int s = 0; s < I.S; ++s) {
    if (I.rank_of(s) == I.rank) {
      Impl::Stage st;
      st.index = s;
      for (int64_t i = first; i < first + I.balance[s]; ++i) {
        Impl::Layer layer;
        layer.module = *(model->begin() + i);
        for (const auto& prm : layer.module.ptr()->parameters()) {
          if (prm.requires_grad()) layer.params.push_back(prm);
        }
        layer.global_index = static_cast<int>(i);
        layer.linear = layer.module.ptr()->as<torch::nn::LinearImpl>();
        if (layer.linear) {  // by-hand W only for a plain Linear with exactly its own parameters
          size_t own = 0;
          for (const auto& prm : layer.linear->parameters()) own += prm.requires_grad() ? 1 : 0;
          if (own != layer.params.size() || layer.linear->weight.dim() != 2) layer.linear = nullptr;
        }
        st.module->push_back(std::to_string(i), layer.module);
        st.layers.push_back(std::move(layer));
      }
      st.layer_forward.assign(st.layers.size(), 0.0);
      for (const auto& layer : st.layers) {
        if (!layer.params.empty()) st.all_linear = st.all_linear && layer.linear != nullptr;
      }
      I.stages.emplace(s, std::move(st));
    }
    first += I.balance[s];
  }
  for (const auto& list : I.schedule.actions) {
    for (const auto& a : list) {
      if (a.op == Op::kBackwardInput) I.split_backward = true;
    }
  }
  if (I.data) {  // replicas of a stage start identical
    at::NoGradGuard no_grad;
    for (auto& [s, st] : I.stages) {
      for (const auto& t : st.module->parameters()) I.data->broadcast(t.detach(), 0)->wait();
      for (const auto& t : st.module->buffers()) I.data->broadcast(t, 0)->wait();
    }
  }
}

PipelineParallel::~PipelineParallel() = default;

c10::Device PipelineParallel::Impl::step_device(const at::Tensor& input,
                                                const at::Tensor& target) const {
  for (const auto& [s, st] : stages) {
    for (const auto& layer : st.layers) {
      if (!layer.params.empty()) return layer.params.front().device();
    }
  }
  if (input.defined()) return input.device();
  return target.defined() ? target.device() : c10::Device(c10::kCPU);
}

void PipelineParallel::Impl::check_step(const at::Tensor& input, const at::Tensor& target) {
  const bool first_stage = rank_of(0) == rank;
  const bool last_stage = rank_of(S - 1) == rank;
  std::vector<int64_t> mine(4 + kMaxDims + 2, -1);  // ..., target rows, error flag
  uint64_t f = schedule.fingerprint();
  std::memcpy(&mine[0], &f, sizeof(f));
  mine[1] = M;
  std::string error;
  if (first_stage) {
    if (!input.defined()) {
      error = "train_step: the first stage's rank needs an input";
    } else if (input.dim() < 1 || input.dim() > kMaxDims) {
      error = "train_step: input must have 1 to " + std::to_string(kMaxDims) + " dimensions, got " +
              std::to_string(input.dim());
    } else {
      mine[2] = static_cast<int64_t>(input.scalar_type());
      mine[3] = input.dim();
      for (int64_t d = 0; d < input.dim(); ++d) mine[4 + d] = input.size(d);
    }
  }
  mine[4 + kMaxDims] =
      last_stage ? (target.defined() && target.dim() > 0 ? target.size(0) : 0) : -2;
  mine[5 + kMaxDims] = error.empty() ? 0 : 1;
  const size_t w = mine.size();
  const auto all = allgather_longs(*comm, mine);
  if (!error.empty()) throw ConfigError(error);
  for (int r = 0; r < comm->size(); ++r) {
    if (all[r * w + 5 + kMaxDims] != 0) {
      throw ConfigError("train_step: pipeline rank " + std::to_string(r) +
                        " rejected its input (see its error); nothing was run");
    }
  }
  for (int r = 0; r < comm->size(); ++r) {
    if (all[r * w] != all[0] || all[r * w + 1] != all[1]) {
      throw ConfigError(
          "pipeline ranks disagree on the schedule or microbatch count at train_step: "
          "rank 0 has " +
          std::to_string(all[1]) + " microbatches, rank " + std::to_string(r) + " has " +
          std::to_string(all[r * w + 1]));
    }
  }
  const int64_t* sig = &all[rank_of(0) * w];
  const int64_t batch = sig[4];
  if (batch < M) {
    throw ConfigError("train_step: a batch of " + std::to_string(batch) +
                      " samples cannot be cut into " + std::to_string(M) +
                      " microbatches; use at least " + std::to_string(M) +
                      " samples or fewer microbatches");
  }
  const int64_t target_rows = all[rank_of(S - 1) * w + 4 + kMaxDims];
  if (target_rows != batch) {
    throw ConfigError("train_step: the last stage's target has " + std::to_string(target_rows) +
                      " rows, the input batch " + std::to_string(batch));
  }
  std::vector<int64_t> signature(sig + 2, sig + 4 + kMaxDims);
  send_meta = signature != last_signature;
  if (send_meta) shape_cache.clear();
  last_signature = signature;
}

at::Tensor PipelineParallel::train_step(const at::Tensor& input, const at::Tensor& target,
                                        const LossFn& loss) {
  Impl& I = *impl_;
  I.check_step(input, target);
  I.step_start = Clock::now();
  I.step_start_abs = std::chrono::duration<double>(I.step_start.time_since_epoch()).count();
  I.mailbox.clear();
  I.posted.clear();
  I.arriving.clear();
  I.in_flight.clear();
  I.batch.clear();
  I.device = I.step_device(input, target);
  I.untagged = !I.comm->p2p_tags(I.device);
  if (I.untagged && !I.untagged_error.empty()) throw ConfigError(I.untagged_error);
  if (!I.send_meta && !I.untagged) {  // shapes known: post every activation receive now
    for (const Action& a : I.schedule.actions[I.rank]) {
      if (a.op != Op::kRecvForward) continue;
      const auto& [shape, dtype] = I.shape_cache.at({a.stage, a.microbatch});
      I.post_recv(0, a.stage, a.microbatch,
                  at::empty(shape, at::TensorOptions(static_cast<at::ScalarType>(dtype)).device(I.device)));
    }
  }
  I.step_loss = at::Tensor();
  I.loss_fn = &loss;
  I.timeline.clear();
  I.micro_inputs.clear();
  I.micro_targets.clear();
  if (I.rank_of(0) == I.rank) I.micro_inputs = input.tensor_split(I.M, 0);
  if (I.rank_of(I.S - 1) == I.rank) I.micro_targets = target.tensor_split(I.M, 0);
  for (auto& [s, st] : I.stages) {
    st.held = st.peak = 0;
    st.live.clear();
  }
  double busy = 0;
  trace::Span step_span("pipeline step", trace::kPipeline);  // idle time inside = bubble
  const auto& actions = (I.untagged ? I.untagged_schedule : I.schedule).actions[I.rank];
  for (size_t j = 0; j < actions.size(); ++j) {
    const Action& a = actions[j];
    const auto t0 = Clock::now();
    if (I.untagged && pipeline::is_comm(a.op)) {
      I.add_to_batch(a, I.batch_end[j]);
    } else {
      I.run(a);
    }
    const auto t1 = Clock::now();
    if (trace::enabled()) {  // F/B/I/W are compute; sends and receives are communication
      trace::complete(pipeline::to_string(a.op), op_index(a.op) >= 0 ? trace::kCompute : trace::kComm,
                      trace::to_us(t0), trace::to_us(t1),
                      trace::Args().add("stage", a.stage).add("microbatch", a.microbatch));
    }
    const double start = seconds_between(I.step_start, t0), end = seconds_between(I.step_start, t1);
    I.timeline.push_back({I.rank, a, start, end});
    const int64_t idx = op_index(a.op);
    if (idx >= 0) {
      auto& st = I.stages.at(a.stage);
      st.sum[idx] += end - start;
      st.count[idx] += 1;
      busy += end - start;
    }
  }
  I.sender->drain();
  for (auto& [work, tensors] : I.in_flight) work->wait();  // a stream wait on NCCL
  I.in_flight.clear();
  step_span.end();
  I.last_busy = busy;
  I.last_span = seconds_between(I.step_start, Clock::now());
  I.micro_inputs.clear();
  I.micro_targets.clear();
  I.reduce_data_parallel();
  wait_for_checkpoint_staging();  // the optimizer step comes next (an async save may still copy)
  return I.step_loss;
}

}  // namespace tandem
