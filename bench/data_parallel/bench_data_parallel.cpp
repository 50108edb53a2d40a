// Data-parallel training step: local (no communication) vs tandem::DistributedDataParallel vs the
// naive per-parameter all-reduce loop. scripts/bench-data-parallel runs it next to PyTorch DDP
// (bench/data_parallel/pytorch_ddp.py) and writes bench/results/data_parallel.json.
//
// One worker program, started on 2 ranks by the launcher:
//   tandemrun --standalone --nproc-per-node 2 build/bin/bench_data_parallel
//       --mode {local|tandem|naive} --batch B --steps N [--warmup W] --out FILE
//
// Model: MLP 1024 -> 4 hidden layers of width 2048 (ReLU) -> 1024, i.e. Linear(1024,2048), ReLU,
// 3 x (Linear(2048,2048), ReLU), Linear(2048,1024); 16.8 M fp32 parameters (64 MiB). Inputs and
// targets are random (seeded per rank), made once, not timed. One step = zero_grad, forward, MSE
// loss, backward, SGD step (lr 0.01, no momentum), with at::set_num_threads(1).
//   local   each rank trains its own replica, no communication (the ranks still run as two
//           processes so both cores are as busy as in the distributed modes)
//   tandem  tandem::DistributedDataParallel with default options (buckets of 25 MiB, first
//           1 MiB); the communicator is tandem::init()'s, with its defaults (--transport tcp: a
//           second communicator with GlooOptions::shared_memory = false)
//   naive   after backward, for each parameter: world->allreduce(p.grad(), kAvg)->wait()
// --codec NAME [--codec-param KEY=VALUE ...] gives DistributedDataParallel a gradient codec
// (make_codec(); scripts/bench-compression runs every codec this way) and adds its traffic to the
// JSON. For the analysis only (not the defaults): --copy-grads sets
// DistributedDataParallelOptions::gradient_as_bucket_view = false, --transport tcp keeps every op
// on TCP loopback.
//
// Every rank times each step (steady_clock); a rank's figure is the median over the timed steps
// and the reported step time is the larger of the ranks' medians. Rank 0 writes one JSON object.
#include <tandem/tandem.h>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Mlp : torch::nn::Module {
  Mlp() {
    layers.push_back(register_module("in", torch::nn::Linear(1024, 2048)));
    for (int i = 0; i < 3; ++i) {
      layers.push_back(register_module("h" + std::to_string(i), torch::nn::Linear(2048, 2048)));
    }
    out = register_module("out", torch::nn::Linear(2048, 1024));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::relu(l->forward(x));
    return out->forward(x);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear out{nullptr};
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// Per-step samples of one rank.
struct Samples {
  std::vector<double> step, forward, backward, comm, optim, overlap, wait;
};

// The figures one rank contributes, in a fixed order (gathered to rank 0 as float64).
enum Field {
  kStepMedian, kStepMean, kStepMin, kForward, kBackward, kComm, kOptim, kOverlap, kWait,
  kOverlapMean, kWaitMean, kLoss, kNumFields
};

std::vector<double> summarize(const Samples& s, double loss) {
  std::vector<double> f(kNumFields, 0.0);
  f[kStepMedian] = median(s.step);
  f[kStepMean] = mean(s.step);
  f[kStepMin] = s.step.empty() ? 0 : *std::min_element(s.step.begin(), s.step.end());
  f[kForward] = median(s.forward);
  f[kBackward] = median(s.backward);
  f[kComm] = median(s.comm);
  f[kOptim] = median(s.optim);
  f[kOverlap] = median(s.overlap);
  f[kWait] = median(s.wait);
  f[kOverlapMean] = mean(s.overlap);
  f[kWaitMean] = mean(s.wait);
  f[kLoss] = loss;
  return f;
}

std::string json_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Data-parallel training step: local vs tandem::DistributedDataParallel vs naive all-reduce "
      "loop"};
  std::string mode = "tandem", out, transport = "default";
  int64_t batch = 32;
  int steps = 30, warmup = 5;
  app.add_option("--mode", mode, "local | tandem | naive")
      ->check(CLI::IsMember({"local", "tandem", "naive"}));
  app.add_option("--batch", batch, "samples per rank")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--transport", transport,
                 "default: tandem::init()'s communicator; tcp: GlooOptions::shared_memory = false")
      ->check(CLI::IsMember({"default", "tcp"}));
  bool copy_grads = false;
  app.add_flag("--copy-grads", copy_grads,
               "tandem mode: DistributedDataParallelOptions::gradient_as_bucket_view = false "
               "(default true)");
  std::string codec_name = "average";
  std::vector<std::string> codec_params;
  app.add_option("--codec", codec_name, "tandem mode: gradient codec (tandem::make_codec name)");
  app.add_option("--codec-param", codec_params, "codec parameter KEY=VALUE (repeatable)");
  app.add_option("--out", out, "JSON file rank 0 writes (empty: stdout only)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    at::set_num_threads(1);
    tandem::Distributed dist = tandem::init();
    std::shared_ptr<tandem::Communicator> comm = dist.world;
    if (transport == "tcp") {
      tandem::GlooOptions o;
      o.shared_memory = false;
      o.store_prefix = "bench-dp-tcp/" + dist.env.run_id;
      o.timeout = dist.world->timeout();
      comm = tandem::connect_gloo(dist.store, dist.env.rank, dist.env.world_size, o);
    }
    const int rank = comm->rank();
    const int size = comm->size();

    torch::manual_seed(0);
    auto model = std::make_shared<Mlp>();
    torch::manual_seed(1000 + rank);
    const auto x = torch::randn({batch, 1024});
    const auto y = torch::randn({batch, 1024});

    std::unique_ptr<tandem::DistributedDataParallel<Mlp>> ddp;
    if (mode == "tandem") {
      tandem::DistributedDataParallelOptions
          options;  // defaults: 25 MiB buckets, first bucket 1 MiB
      if (copy_grads) options.gradient_as_bucket_view = false;
      std::map<std::string, std::string> params;
      for (const auto& kv : codec_params) {
        const auto eq = kv.find('=');
        if (eq == std::string::npos) throw std::runtime_error("--codec-param wants KEY=VALUE, got " + kv);
        params[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      options.codec = tandem::make_codec(codec_name, params);
      ddp = std::make_unique<tandem::DistributedDataParallel<Mlp>>(model, comm, options);
    }
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));
    const auto params = model->parameters();
    int64_t param_bytes = 0;
    for (const auto& p : params) param_bytes += p.numel() * static_cast<int64_t>(p.element_size());

    Samples s;
    double last_loss = 0;
    comm->barrier()->wait();
    for (int it = 0; it < warmup + steps; ++it) {
      const auto t0 = Clock::now();
      opt.zero_grad();
      torch::Tensor loss = ddp ? torch::mse_loss((*ddp)(x), y) : torch::mse_loss(model->forward(x), y);
      const auto t1 = Clock::now();
      loss.backward();  // tandem: the reducer's end-of-backward callback waits for every bucket
      const auto t2 = Clock::now();
      if (mode == "naive") {
        for (const auto& p : params) comm->allreduce(p.grad(), tandem::ReduceOp::kAvg)->wait();
      }
      const auto t3 = Clock::now();
      opt.step();
      const auto t4 = Clock::now();
      if (it < warmup) continue;
      auto ms = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
      };
      s.step.push_back(ms(t0, t4));
      s.forward.push_back(ms(t0, t1));
      s.backward.push_back(ms(t1, t2));
      s.comm.push_back(ms(t2, t3));
      s.optim.push_back(ms(t3, t4));
      if (ddp) {
        s.overlap.push_back(ddp->reducer().last_overlap_seconds() * 1e3);
        s.wait.push_back(ddp->reducer().last_wait_seconds() * 1e3);
      }
      if (it + 1 == warmup + steps) last_loss = loss.item<double>();
    }

    // Gather every rank's figures to all ranks (outside the timed loop).
    const auto mine = summarize(s, last_loss);
    auto input = torch::tensor(mine, torch::kFloat64);
    auto all = torch::empty({size * kNumFields}, torch::kFloat64);
    comm->allgather(all, input)->wait();
    const auto* a = all.data_ptr<double>();
    auto field = [&](int r, Field f) { return a[r * kNumFields + f]; };
    auto max_over_ranks = [&](Field f) {
      double m = field(0, f);
      for (int r = 1; r < size; ++r) m = std::max(m, field(r, f));
      return m;
    };
    auto mean_over_ranks = [&](Field f) {
      double m = 0;
      for (int r = 0; r < size; ++r) m += field(r, f);
      return m / size;
    };

    if (rank == 0) {
      std::ostringstream j;
      j << "{\"mode\": \"" << mode << "\", \"transport\": \"" << transport
        << "\", \"gradient_as_bucket_view\": " << (copy_grads ? "false" : "true")
        << ", \"ranks\": " << size
        << ", \"batch\": " << batch << ", \"steps\": " << steps << ", \"warmup\": " << warmup
        << ", \"threads\": " << at::get_num_threads()
        << ", \"param_bytes\": " << param_bytes
        << ", \"step_ms\": " << json_number(max_over_ranks(kStepMedian))
        << ", \"step_mean_ms\": " << json_number(max_over_ranks(kStepMean))
        << ", \"step_min_ms\": " << json_number(max_over_ranks(kStepMin))
        << ", \"rank_step_ms\": [";
      for (int r = 0; r < size; ++r) j << (r ? ", " : "") << json_number(field(r, kStepMedian));
      j << "], \"forward_ms\": " << json_number(mean_over_ranks(kForward))
        << ", \"backward_ms\": " << json_number(mean_over_ranks(kBackward))
        << ", \"after_backward_comm_ms\": " << json_number(mean_over_ranks(kComm))
        << ", \"optimizer_ms\": " << json_number(mean_over_ranks(kOptim));
      if (ddp) {
        int64_t allreduced = 0;
        std::ostringstream bucket_bytes;
        const auto plan = ddp->reducer().bucket_plan();
        for (size_t b = 0; b < plan.size(); ++b) {
          int64_t bytes = 0;
          for (int64_t p : plan[b]) bytes += params[p].numel() * static_cast<int64_t>(params[p].element_size());
          bucket_bytes << (b ? ", " : "") << bytes;
          allreduced += bytes;
        }
        j << ", \"buckets\": " << plan.size() << ", \"bucket_bytes\": [" << bucket_bytes.str() << "]"
          << ", \"allreduced_bytes_per_step\": " << allreduced
          << ", \"overlap_ms\": " << json_number(mean_over_ranks(kOverlap))
          << ", \"wait_ms\": " << json_number(mean_over_ranks(kWait))
          << ", \"overlap_mean_ms\": " << json_number(mean_over_ranks(kOverlapMean))
          << ", \"wait_mean_ms\": " << json_number(mean_over_ranks(kWaitMean))
          << ", \"codec\": \"" << ddp->reducer().codec().name() << "\""
          << ", \"bytes_per_step\": " << ddp->reducer().codec().bytes_sent_last_step()
          << ", \"uncompressed_bytes_per_step\": "
          << ddp->reducer().codec().uncompressed_bytes_last_step()
          << ", \"ratio\": " << json_number(ddp->reducer().codec().compression_ratio());
      } else if (mode == "naive") {
        j << ", \"allreduces_per_step\": " << params.size()
          << ", \"allreduced_bytes_per_step\": " << param_bytes;
      }
      j << ", \"final_loss\": " << json_number(field(0, kLoss)) << "}";
      std::cout << j.str() << std::endl;
      if (!out.empty()) {
        std::ofstream f(out);
        f << j.str() << "\n";
        if (!f) throw std::runtime_error("cannot write " + out);
      }
    }
    comm->barrier()->wait();
    ddp.reset();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_data_parallel: " << e.what() << std::endl;
    return 1;
  }
}
