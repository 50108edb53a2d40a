// Pipeline schedules on 2 stages (2 ranks x 1 compute thread), m = 8 microbatches: per schedule
// the measured step time, the measured bubble (from the recorded action times), the bubble
// simulated from each step's own action durations and the measured send latency, send and
// receive overheads (and, beside it, from the per-stage mean F/B/I/W costs), and the peak
// activation bytes per stage. Run by scripts/bench-pipeline under
// tandemrun; rank 0 prints the table and writes the JSON.
//   bench_pipeline --out FILE [--quick] [--steps N] [--command TEXT] [--revision REV]
#include <tandem/runtime/init.h>
#include <tandem/runtime/pipeline_parallel.h>
#include <tandem/runtime/pipeline_simulate.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Half the median round trip of an activation-sized tensor between ranks 0 and 1.
double send_latency(tandem::Communicator& comm, const at::Tensor& t, int rounds) {
  std::vector<double> rtt;
  auto buf = at::empty_like(t);
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = Clock::now();
    if (comm.rank() == 0) {
      comm.send(t, 1, 7)->wait();
      comm.recv(buf, 1, 8)->wait();
    } else {
      comm.recv(buf, 0, 7)->wait();
      comm.send(t, 0, 8)->wait();
    }
    rtt.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  auto v = at::full({1}, median(rtt) / 2, at::kDouble);
  comm.allreduce(v, tandem::ReduceOp::kMax)->wait();
  return v.item<double>();
}

// sum += w * c for every per-stage cost (sum starts empty).
void accumulate(tandem::pipeline::Costs& sum, const tandem::pipeline::Costs& c, double w) {
  auto add = [w](std::vector<double>& to, const std::vector<double>& from) {
    to.resize(from.size(), 0.0);
    for (size_t i = 0; i < from.size(); ++i) to[i] += w * from[i];
  };
  add(sum.forward, c.forward);
  add(sum.backward_input, c.backward_input);
  add(sum.backward_weight, c.backward_weight);
  add(sum.backward, c.backward);
}

// extra[s] += w * (the first backward of stage s in a step - the mean of its others): B, or W
// for the split schedules (W writes the gradients), from the step's per_action costs.
void accumulate_first_backward(std::vector<double>& extra, const tandem::pipeline::Costs& c,
                               double w) {
  using tandem::pipeline::Op;
  extra.resize(c.forward.size(), 0.0);
  for (size_t s = 0; s < extra.size(); ++s) {
    std::vector<double> d;
    for (const auto& [key, seconds] : c.per_action) {
      const auto& [op, stage, mb] = key;
      if (stage == static_cast<int>(s) && (op == Op::kBackward || op == Op::kBackwardWeight)) {
        d.push_back(seconds);  // in microbatch order: the map is sorted by (op, stage, mb)
      }
    }
    if (d.size() < 2) continue;
    double rest = 0;
    for (size_t i = 1; i < d.size(); ++i) rest += d[i] / static_cast<double>(d.size() - 1);
    extra[s] += w * (d[0] - rest);
  }
}

// The 1-, 5- and 15-minute load averages (/proc/loadavg), as a JSON array.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  if (!(in >> a >> b >> c)) return "null";
  std::ostringstream out;
  out << "[" << a << ", " << b << ", " << c << "]";
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("tandem pipeline schedule benchmark (2 ranks under tandemrun)");
  // The bubble simulated for a schedule is the median over timed steps of each step simulated
  // with its own measured mean F/B/I/W per stage and the communication terms seen in its
  // timeline (pipeline::measured_comm_costs), counted like measured_bubble(): each rank until
  // its own last action. The idle ping-pong latency is reported next to it.
  std::string out, command = "scripts/bench pipeline", revision = "unknown";
  bool quick = false;
  int steps = 0, warmup = 2, microbatches = 8;
  int64_t batch = 256, width = 1024, layers_per_stage = 4;
  app.add_option("--out", out, "JSON file (rank 0)")->required();
  app.add_option("--command", command);
  app.add_option("--revision", revision);
  app.add_flag("--quick", quick, "fewer steps");
  app.add_option("--steps", steps, "timed steps per schedule (default 12, --quick 4)");
  CLI11_PARSE(app, argc, argv);
  if (steps <= 0) steps = quick ? 4 : 12;

  try {
    at::set_num_threads(1);
    auto dist = tandem::init();
    auto& comm = *dist.world;
    if (comm.size() != 2) throw tandem::ConfigError("bench_pipeline runs on exactly 2 ranks");
    const int rank = comm.rank();
    torch::manual_seed(1);
    const auto x = torch::randn({batch, width}), y = torch::randn({batch, width});
    const double latency = send_latency(comm, torch::randn({batch / microbatches, width}), 50);

    const auto load_start = load_average();
    struct Row {
      std::string name;
      int v = 1;
      double step_ms = 0, bubble_measured = 0;
      double bubble_simulated = 0, bubble_simulated_makespan = 0, bubble_simulated_no_comm = 0,
             bubble_simulated_stage_means = 0, bubble_simulated_mean_costs = 0;
      std::vector<double> first_backward_extra;  // per stage, seconds, mean over steps
      std::vector<int64_t> peak_bytes;
      tandem::pipeline::Costs costs;
    };
    std::vector<Row> rows;
    for (const auto& [name, v] : std::vector<std::pair<std::string, int>>{
             {"gpipe", 1}, {"1f1b", 1}, {"interleaved", 2}, {"zbh1", 1}}) {
      // 2 * layers_per_stage Linear+ReLU blocks; the same weights for every schedule.
      torch::manual_seed(2);
      torch::nn::Sequential model;
      for (int64_t i = 0; i < 2 * layers_per_stage; ++i) {
        model->push_back(torch::nn::Linear(width, width));
        model->push_back(torch::nn::ReLU());
      }
      tandem::PipelineOptions o;
      o.schedule = name;
      o.num_microbatches = microbatches;
      o.virtual_stages = v;
      o.balance.assign(2 * v, 2 * layers_per_stage * 2 / (2 * v));
      tandem::PipelineParallel pipe(model, dist.world, o);
      model = nullptr;
      auto loss = [](const at::Tensor& out, const at::Tensor& t) {
        return torch::mse_loss(out, t);
      };
      for (int i = 0; i < warmup; ++i) pipe.train_step(x, y, loss);
      std::vector<double> step_s, bubbles, sim_own, sim_makespan, sim_no_comm, sim_means;
      std::vector<std::vector<tandem::pipeline::TimedAction>> timelines;
      Row row;
      for (int i = 0; i < steps; ++i) {
        for (auto& p : pipe.parameters()) p.mutable_grad() = at::Tensor();
        pipe.reset_stats();
        const auto t0 = Clock::now();
        pipe.train_step(x, y, loss);
        auto dt =
            at::full({1}, std::chrono::duration<double>(Clock::now() - t0).count(), at::kDouble);
        comm.allreduce(dt, tandem::ReduceOp::kMax)->wait();
        step_s.push_back(dt.item<double>());
        const auto b = pipe.measured_bubble();
        bubbles.push_back((b[0] + b[1]) / 2);
        // This step simulated with its own costs: the measured figure is a median of per-step
        // bubbles, and a bubble is not linear in its costs. Both ranks share one clock (one
        // host), so the timeline shows the transfers the step itself saw, under load.
        timelines.push_back(pipe.gather_timeline());
        auto costs = pipe.measured_costs();
        costs.comm = tandem::pipeline::measured_comm_costs({timelines.back()});
        sim_means.push_back(tandem::pipeline::simulate(pipe.schedule(), costs).mean_own_bubble);
        accumulate(row.costs, costs, 1.0 / steps);  // the mean over steps, for the report
        // The step's own duration of each action: the first backward of a stage, which
        // allocates the gradients, is longer than the mean says, and where it lies matters.
        costs.per_action = tandem::pipeline::measured_action_costs(timelines.back());
        accumulate_first_backward(row.first_backward_extra, costs, 1.0 / steps);
        const auto sim = tandem::pipeline::simulate(pipe.schedule(), costs);
        sim_own.push_back(sim.mean_own_bubble);
        sim_makespan.push_back(sim.mean_bubble);
        costs.comm = {};
        sim_no_comm.push_back(tandem::pipeline::simulate(pipe.schedule(), costs).mean_own_bubble);
      }
      row.name = name;
      row.v = v;
      row.step_ms = 1e3 * median(step_s);
      row.bubble_measured = median(bubbles);
      row.bubble_simulated = median(sim_own);
      row.bubble_simulated_makespan = median(sim_makespan);
      row.bubble_simulated_no_comm = median(sim_no_comm);
      row.bubble_simulated_stage_means = median(sim_means);
      row.costs.comm = tandem::pipeline::measured_comm_costs(timelines);
      row.bubble_simulated_mean_costs =
          tandem::pipeline::simulate(pipe.schedule(), row.costs).mean_own_bubble;
      // Peak bytes per global stage (stage s on rank s % 2).
      std::vector<int64_t> mine(2 * v, 0);
      const auto local = pipe.local_stages();
      const auto peaks = pipe.peak_activation_bytes();
      for (size_t i = 0; i < local.size(); ++i) mine[local[i]] = peaks[i];
      auto t = at::empty({2 * v}, at::kLong);
      std::copy(mine.begin(), mine.end(), t.data_ptr<int64_t>());
      comm.allreduce(t, tandem::ReduceOp::kSum)->wait();
      row.peak_bytes.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + 2 * v);
      if (rank == 0) {
        const auto timeline = pipe.gather_timeline();
        tandem::pipeline::write_text_file(
            out + "." + name + ".svg",
            tandem::pipeline::to_svg(pipe.schedule(), timeline, name + " (measured, last step)"));
      } else {
        pipe.gather_timeline();
      }
      rows.push_back(row);
    }

    if (rank == 0) {
      std::printf(
          "pipeline schedules: %lld Linear(%lld)+ReLU blocks on 2 ranks, batch %lld, m = %d, "
          "1 thread per rank, idle ping-pong latency %.3f ms\n",
          static_cast<long long>(layers_per_stage * 2), static_cast<long long>(width),
          static_cast<long long>(batch), microbatches, latency * 1e3);
      std::printf("%-12s %8s %8s %9s %6s %7s %7s %7s %7s %7s %s\n", "schedule", "step_ms",
                  "measured", "simulated", "|diff|", "no_comm", "means", "lat_ms", "send_ms",
                  "recv_ms", "first B extra ms per stage");
      std::ostringstream json;
      json << "{\n  \"benchmark\": \"pipeline\",\n  \"command\": \"" << command
           << "\",\n  \"revision\": \"" << revision
           << "\",\n  \"quick\": " << (quick ? "true" : "false")
           << ",\n  \"config\": {\"ranks\": 2, \"threads_per_rank\": 1, \"microbatches\": "
           << microbatches << ", \"batch\": " << batch << ", \"width\": " << width
           << ", \"linear_layers\": " << 2 * layers_per_stage << ", \"timed_steps\": " << steps
           << ", \"warmup_steps\": " << warmup << "},\n  \"pingpong_latency_ms\": " << latency * 1e3
           << ",\n  \"load_average\": {\"start\": " << load_start
           << ", \"end\": " << load_average() << "},\n  \"schedules\": {\n";
      double zb = 0, ofob = 0;
      bool all_within = true;
      for (size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        const double diff = std::abs(r.bubble_measured - r.bubble_simulated);
        all_within = all_within && diff <= 0.05;
        if (r.name == "zbh1") zb = r.step_ms;
        if (r.name == "1f1b") ofob = r.step_ms;
        const auto& c = r.costs.comm;
        std::printf("%-12s %8.2f %8.3f %9.3f %6.3f %7.3f %7.3f %7.3f %7.3f %7.3f", r.name.c_str(),
                    r.step_ms, r.bubble_measured, r.bubble_simulated, diff,
                    r.bubble_simulated_no_comm, r.bubble_simulated_stage_means,
                    1e3 * c.send_latency, 1e3 * c.send_overhead, 1e3 * c.recv_overhead);
        for (auto e : r.first_backward_extra) std::printf(" %.2f", 1e3 * e);
        std::printf("\n");
        json << "    \"" << r.name << "\": {\"virtual_stages\": " << r.v
             << ", \"step_ms\": " << r.step_ms << ", \"bubble_measured\": " << r.bubble_measured
             << ", \"bubble_simulated\": " << r.bubble_simulated
             << ", \"bubble_simulated_makespan\": " << r.bubble_simulated_makespan
             << ", \"bubble_simulated_no_comm\": " << r.bubble_simulated_no_comm
             << ", \"bubble_simulated_stage_means\": " << r.bubble_simulated_stage_means
             << ", \"bubble_simulated_mean_costs\": " << r.bubble_simulated_mean_costs
             << ", \"send_latency_ms\": " << 1e3 * c.send_latency
             << ", \"send_overhead_ms\": " << 1e3 * c.send_overhead
             << ", \"recv_overhead_ms\": " << 1e3 * c.recv_overhead
             << ", \"peak_activation_bytes\": [";
        for (size_t j = 0; j < r.peak_bytes.size(); ++j) json << (j ? ", " : "") << r.peak_bytes[j];
        json << "], \"costs_ms\": {";
        for (size_t s = 0; s < r.costs.forward.size(); ++s) {
          json << (s ? ", " : "") << "\"stage" << s << "\": {\"F\": " << 1e3 * r.costs.forward[s]
               << ", \"B\": " << 1e3 * r.costs.b(s)
               << ", \"I\": " << 1e3 * r.costs.backward_input[s]
               << ", \"W\": " << 1e3 * r.costs.backward_weight[s]
               << ", \"first_backward_extra\": " << 1e3 * r.first_backward_extra[s] << "}";
        }
        json << "}}" << (i + 1 < rows.size() ? "," : "") << "\n";
      }
      json << "  },\n  \"goals\": {\"bubble_within_0.05_of_simulated\": "
           << (all_within ? "true" : "false")
           << ", \"zbh1_faster_than_1f1b\": " << (zb < ofob ? "true" : "false") << "}\n}\n";
      std::printf("goal: measured bubble within 0.05 of simulated for every schedule: %s\n",
                  all_within ? "met" : "NOT met");
      std::printf("goal: zbh1 faster than 1f1b: %s (%.2f vs %.2f ms)\n",
                  zb < ofob ? "met" : "NOT met", zb, ofob);
      tandem::pipeline::write_text_file(out, json.str());
    }
    return 0;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    return 1;
  }
}
