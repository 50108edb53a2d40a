// Sharded data parallel: step time and memory of tandem::DistributedDataParallel and
// tandem::ShardedDataParallel stages 1-3 with AdamW. scripts/bench-sharded runs it next to
// PyTorch's ZeroRedundancyOptimizer (bench/sharded/pytorch_zero.py) and writes
// bench/results/sharded.json.
//
//   tandemrun --standalone --nproc-per-node 2 build/bin/bench_sharded
//       --mode {ddp|zero1|zero2|zero3|comm} --batch B --steps N [--warmup W] --out FILE
//
// Model: the data-parallel benchmark's W1 (bench/data_parallel): Linear(1024,2048), ReLU,
// 3 x (Linear(2048,2048), ReLU), Linear(2048,1024), 16.8 M fp32 parameters, batch 32 per rank,
// MSE, at::set_num_threads(1); every Linear is a ShardedUnit (a plain Linear outside stage 3).
// AdamW lr 1e-3, weight decay 0.01. One step = zero_grad, forward, loss, backward, optimizer step.
//   ddp       DistributedDataParallel, default options (25 MiB buckets)
//   zeroK     ShardedDataParallel with sharding.stage = K and default options
// --param-dtype bf16 trains bf16 parameters with fp32 masters (precision.param_dtype) and
// --autocast bf16 runs the forward under bf16 autocast (scripts/bench-precision uses both).
// --backward-prefetch pre|post sets sharding.backward_prefetch (stage 3; default post).
//   comm      no training: times, per step's worth of buckets (the stage-1 units), the all-reduce
//             DDP issues and the reduce-scatter + all-gather the stages issue (all through
//             shared memory on one host), to tell communication from everything else
// Memory: tandem's host allocator is libtorch's CPU allocator here; its peak allocated bytes are
// reset before each phase of a step (zero_grad + forward, backward, optimizer step) and read after
// it; peak_bytes is the largest over the timed steps. The training state held between steps
// is split into parameters and gradients (ShardedDataParallel::memory_use, or the model's tensors
// under DDP) and the optimizer's state tensors.
// Every rank times each step (steady_clock); a rank's figure is the median over the timed steps;
// the step time reported is the larger of the ranks' medians, memory the larger of the ranks'.
#include <tandem/memory/cpu_allocator.h>
#include <tandem/tandem.h>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using Unit = tandem::ShardedUnit<torch::nn::LinearImpl>;

struct Mlp : torch::nn::Module {
  Mlp() {
    layers.push_back(register_module("in", Unit(torch::nn::Linear(1024, 2048))));
    for (int i = 0; i < 3; ++i) {
      layers.push_back(
          register_module("h" + std::to_string(i), Unit(torch::nn::Linear(2048, 2048))));
    }
    out = register_module("out", Unit(torch::nn::Linear(2048, 1024)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::relu(l(x));
    return out(x);
  }
  std::vector<Unit> layers;
  Unit out{nullptr};
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// The figures one rank contributes, in a fixed order (all-gathered as float64).
// clang-format off
enum Field {
  kStep, kForward, kBackward, kOptim, kGatherWait, kReduceWait, kOverlap, kPeak, kPeakForward,
  kPeakBackward, kPeakOptim, kParamBytes, kGradBytes, kOptimBytes, kAllocatedBetweenSteps, kLoss,
  kAllreduce, kReduceScatter, kAllgather, kAllreduceExtra, kReduceScatterExtra, kAllgatherExtra,
  kNumFields
};

const char* const kFieldNames[kNumFields] = {
    "step_ms", "forward_ms", "backward_ms", "optimizer_ms", "gather_wait_ms", "reduce_wait_ms",
    "overlap_ms", "peak_bytes", "peak_forward_bytes", "peak_backward_bytes",
    "peak_optimizer_bytes", "parameter_bytes", "gradient_bytes", "optimizer_state_bytes",
    "allocated_between_steps_bytes", "final_loss", "allreduce_ms", "reduce_scatter_ms",
    "allgather_ms", "allreduce_temporary_bytes", "reduce_scatter_temporary_bytes",
    "allgather_temporary_bytes"};
// clang-format on

// comm mode: per step's worth of `flat_numels` buckets, the medians over `reps` of the time one
// rank spends in all-reduce (`world`), reduce-scatter and all-gather (`group`); then
// the memory each collective allocates for itself on the largest bucket (allocator peak during
// it minus the bytes allocated before).
void time_collectives(tandem::Communicator& world, tandem::Communicator& group,
                      const std::vector<int64_t>& flat_numels, int warmup, int reps,
                      tandem::memory::HostMemoryStack& allocator, std::vector<double>& f) {
  const int n = group.size();
  std::vector<at::Tensor> flats, shards;
  for (int64_t numel : flat_numels) {
    flats.push_back(torch::randn({numel}));
    shards.push_back(torch::randn({numel / n}));
  }
  std::vector<double> ar, rs, ag;
  for (int it = 0; it < warmup + reps; ++it) {
    world.barrier()->wait();
    const auto t0 = Clock::now();
    for (auto& t : flats) world.allreduce(t, tandem::ReduceOp::kAvg)->wait();
    const auto t1 = Clock::now();
    for (size_t b = 0; b < flats.size(); ++b) {
      group.reduce_scatter(shards[b], flats[b], tandem::ReduceOp::kAvg)->wait();
    }
    const auto t2 = Clock::now();
    for (size_t b = 0; b < flats.size(); ++b) group.allgather(flats[b], shards[b])->wait();
    const auto t3 = Clock::now();
    if (it < warmup) continue;
    ar.push_back(ms_between(t0, t1));
    rs.push_back(ms_between(t1, t2));
    ag.push_back(ms_between(t2, t3));
  }
  f[kAllreduce] = median(ar);
  f[kReduceScatter] = median(rs);
  f[kAllgather] = median(ag);
  const size_t largest = static_cast<size_t>(
      std::max_element(flat_numels.begin(), flat_numels.end()) - flat_numels.begin());
  auto temporary = [&](const std::function<tandem::WorkPtr()>& issue) {
    world.barrier()->wait();
    const int64_t before = allocator.stats().allocated_bytes.current;
    allocator.pool().reset_peak();
    issue()->wait();
    return static_cast<double>(allocator.stats().allocated_bytes.peak - before);
  };
  f[kAllreduceExtra] =
      temporary([&] { return world.allreduce(flats[largest], tandem::ReduceOp::kAvg); });
  f[kReduceScatterExtra] = temporary([&] {
    return group.reduce_scatter(shards[largest], flats[largest], tandem::ReduceOp::kAvg);
  });
  f[kAllgatherExtra] = temporary([&] { return group.allgather(flats[largest], shards[largest]); });
}

std::string json_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sharded data parallel: DDP vs ZeRO stages 1-3, step time and memory"};
  std::string mode = "zero1", out;
  int64_t batch = 32;
  int steps = 20, warmup = 3;
  app.add_option("--mode", mode, "ddp | zero1 | zero2 | zero3 | comm")
      ->check(CLI::IsMember({"ddp", "zero1", "zero2", "zero3", "comm"}));
  app.add_option("--batch", batch, "samples per rank")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--out", out, "JSON file rank 0 writes (empty: stdout only)");
  std::string param_dtype = "fp32", autocast = "off";
  app.add_option("--param-dtype", param_dtype, "fp32 | bf16 (with fp32 masters)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--autocast", autocast, "off | bf16")->check(CLI::IsMember({"off", "bf16"}));
  std::string backward_prefetch = tandem::ShardingOptions().backward_prefetch;
  app.add_option("--backward-prefetch", backward_prefetch, "pre | post (sharding.backward_prefetch)")
      ->check(CLI::IsMember({"pre", "post"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    // Before any tensor exists, so that every allocation is counted.
    auto allocator = tandem::memory::install_host_cpu_allocator();
    at::set_num_threads(1);
    tandem::Distributed dist = tandem::init();
    std::shared_ptr<tandem::Communicator> comm = dist.world;
    const int rank = comm->rank();
    const int size = comm->size();

    torch::manual_seed(0);
    auto model = std::make_shared<Mlp>();
    int64_t parameters = 0;
    for (const auto& p : model->parameters()) parameters += p.numel();
    torch::manual_seed(1000 + rank);
    const auto x = torch::randn({batch, 1024});
    const auto y = torch::randn({batch, 1024});

    std::unique_ptr<tandem::DistributedDataParallel<Mlp>> ddp;
    std::unique_ptr<tandem::ShardedDataParallel<Mlp>> sdp;
    const int stage = mode == "ddp" ? 0 : mode == "comm" ? 1 : mode.back() - '0';
    tandem::DistributedDataParallelOptions ddp_options;
    if (param_dtype == "bf16") ddp_options.mixed_precision.param_dtype = at::kBFloat16;
    if (stage == 0) {
      ddp = std::make_unique<tandem::DistributedDataParallel<Mlp>>(model, comm, ddp_options);
    } else {
      tandem::ShardingOptions sharding;
      sharding.stage = stage;
      sharding.backward_prefetch = backward_prefetch;
      sdp = std::make_unique<tandem::ShardedDataParallel<Mlp>>(model, comm, sharding, ddp_options);
    }
    std::vector<double> f(kNumFields, 0.0);
    int units = 0;
    int64_t largest_unit_bytes = 0;
    if (sdp) {
      for (const auto& shard : sdp->parameters()) {
        ++units;
        largest_unit_bytes = std::max(largest_unit_bytes, bytes_of(shard) * size);
      }
    }

    if (mode == "comm") {
      std::vector<int64_t> flats;
      for (const auto& shard : sdp->parameters()) flats.push_back(shard.numel() * size);
      // A group of every rank, as ShardedDataParallel's collectives run on.
      auto group = tandem::DeviceMesh(comm, {{"dp_shard", size}}).group({"dp_shard"}, "gather");
      time_collectives(*comm, *group, flats, warmup, steps, *allocator, f);
    } else {
      torch::optim::AdamW opt(sdp ? sdp->parameters() : ddp->parameters(),
                              torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
      std::vector<double> step_ms, fwd, bwd, optim, gather_wait, reduce_wait, overlap;
      double last_loss = 0;
      // The peak of each phase (zero_grad + forward, backward, optimizer step) of the timed steps.
      int64_t peaks[3] = {0, 0, 0};
      auto phase_peak = [&](int phase, bool timed) {
        if (timed) peaks[phase] = std::max(peaks[phase], allocator->stats().allocated_bytes.peak);
        allocator->pool().reset_peak();
      };
      comm->barrier()->wait();
      for (int it = 0; it < warmup + steps; ++it) {
        const bool timed = it >= warmup;
        allocator->pool().reset_peak();
        const auto t0 = Clock::now();
        opt.zero_grad();
        torch::Tensor loss;
        {
          tandem::AutocastGuard guard(at::kCPU, at::kBFloat16, autocast == "bf16");
          loss = torch::mse_loss((sdp ? (*sdp)(x) : (*ddp)(x)).to(at::kFloat), y);
        }
        const auto t1 = Clock::now();
        phase_peak(0, timed);
        loss.backward();  // both wait for their last reduction at the end of backward
        const auto t2 = Clock::now();
        phase_peak(1, timed);
        opt.step();
        const auto t3 = Clock::now();
        phase_peak(2, timed);
        if (!timed) continue;
        step_ms.push_back(ms_between(t0, t3));
        fwd.push_back(ms_between(t0, t1));
        bwd.push_back(ms_between(t1, t2));
        optim.push_back(ms_between(t2, t3));
        if (sdp) {
          const auto times = sdp->core().last_step_times();
          gather_wait.push_back(times.gather_wait_seconds * 1e3);
          reduce_wait.push_back(times.reduce_wait_seconds * 1e3);
          overlap.push_back(times.overlap_seconds * 1e3);
        } else {
          reduce_wait.push_back(ddp->reducer().last_wait_seconds() * 1e3);
          overlap.push_back(ddp->reducer().last_overlap_seconds() * 1e3);
        }
        if (it + 1 == warmup + steps) last_loss = loss.item<double>();
      }
      const auto stats = allocator->stats();
      f[kStep] = median(step_ms);
      f[kForward] = median(fwd);
      f[kBackward] = median(bwd);
      f[kOptim] = median(optim);
      f[kGatherWait] = median(gather_wait);
      f[kReduceWait] = median(reduce_wait);
      f[kOverlap] = median(overlap);
      f[kPeak] = static_cast<double>(std::max({peaks[0], peaks[1], peaks[2]}));
      f[kPeakForward] = static_cast<double>(peaks[0]);
      f[kPeakBackward] = static_cast<double>(peaks[1]);
      f[kPeakOptim] = static_cast<double>(peaks[2]);
      f[kAllocatedBetweenSteps] = static_cast<double>(stats.allocated_bytes.current);
      f[kLoss] = last_loss;
      // The training state held between steps.
      if (sdp) {
        const auto use = sdp->core().memory_use();
        f[kParamBytes] = static_cast<double>(use.parameter_bytes);
        f[kGradBytes] = static_cast<double>(use.gradient_bytes);
      } else {
        for (const auto& p : model->parameters()) {
          f[kParamBytes] += static_cast<double>(bytes_of(p));
          f[kGradBytes] += static_cast<double>(bytes_of(p.grad()));
        }
        if (param_dtype != "fp32") {  // the fp32 masters and their gradients
          for (const auto& m : ddp->parameters()) {
            f[kParamBytes] += static_cast<double>(bytes_of(m));
            f[kGradBytes] += static_cast<double>(bytes_of(m.grad()));
          }
        }
      }
      for (const auto& item : opt.state()) {
        const auto& s = static_cast<const torch::optim::AdamWParamState&>(*item.second);
        f[kOptimBytes] += static_cast<double>(bytes_of(s.exp_avg()) + bytes_of(s.exp_avg_sq()) +
                                              bytes_of(s.max_exp_avg_sq()));
      }
    }

    // Every rank's figures to every rank (outside the timed loop).
    auto all = torch::empty({size * kNumFields}, torch::kFloat64);
    comm->allgather(all, torch::tensor(f, torch::kFloat64))->wait();
    const auto* a = all.data_ptr<double>();
    if (rank == 0) {
      std::ostringstream j;
      j << "{\"mode\": \"" << mode << "\", \"stage\": " << stage << ", \"ranks\": " << size
        << ", \"batch\": " << batch << ", \"steps\": " << steps << ", \"warmup\": " << warmup
        << ", \"threads\": " << at::get_num_threads() << ", \"parameters\": " << parameters
        << ", \"units\": " << units << ", \"largest_unit_bytes\": " << largest_unit_bytes
        << ", \"param_dtype\": \"" << param_dtype << "\", \"autocast\": \"" << autocast << "\"";
      if (ddp) j << ", \"buckets\": " << ddp->reducer().bucket_plan().size();
      for (int k = 0; k < kNumFields; ++k) {
        double worst = a[k];
        for (int r = 1; r < size; ++r) worst = std::max(worst, a[r * kNumFields + k]);
        j << ", \"" << kFieldNames[k] << "\": " << json_number(k == kLoss ? a[k] : worst);
      }
      j << ", \"rank_step_ms\": [";
      for (int r = 0; r < size; ++r) j << (r ? ", " : "") << json_number(a[r * kNumFields + kStep]);
      j << "]}";
      std::cout << j.str() << std::endl;
      if (!out.empty()) {
        std::ofstream file(out);
        file << j.str() << "\n";
        if (!file) throw std::runtime_error("cannot write " + out);
      }
    }
    comm->barrier()->wait();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_sharded: " << e.what() << std::endl;
    return 1;
  }
}
