// train_pipeline: pipeline-parallel training of an MLP split into stages, one per rank.
//
//   tandemrun --standalone --nproc-per-node 2 build/bin/train_pipeline --config examples/configs/train_pipeline.yaml
//   ... build/bin/train_pipeline --set pipeline.schedule=gpipe --set pipeline.num_microbatches=4
//
// The model is a torch::nn::Sequential; tandem::PipelineParallel keeps each rank's stage, cuts
// every batch into pipeline.num_microbatches and runs the config's pipeline.schedule (gpipe, 1f1b,
// interleaved with pipeline.virtual_stages, zbh1), or a schedule file with --schedule-file;
// train.steps, batch_size, lr and seed come from the config too. The last stage's rank prints
// the loss; at the end rank 0 writes the schedule picture of the last step with measured durations (SVG) and a Chrome trace,
// and prints the measured bubble next to the bubble simulated from the measured per-stage costs
// and the send/receive costs seen in the last step.
// parallel.pp is the number of stages (2 in the config); with a larger world, ranks form
// pipeline x data-parallel groups (2D), both from the Context's mesh.
#include <tandem/runtime/context.h>
#include <tandem/runtime/pipeline_parallel.h>
#include <tandem/runtime/pipeline_simulate.h>
#include <tandem/runtime/run_main.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "examples/cli.h"

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach tandemrun even if killed later
  return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
    CLI::App app("tandem example: pipeline-parallel MLP training (start with tandemrun)");
    std::string schedule_file, svg = "pipeline_schedule.svg", trace = "pipeline_trace.json";
    int64_t hidden = 256, layers = 3, log_every = 20;
    app.add_option("--schedule-file", schedule_file, "a schedule in tandem's text format (wins)");
    app.add_option("--hidden", hidden, "hidden width")->check(CLI::PositiveNumber);
    app.add_option("--layers", layers, "hidden Linear+ReLU blocks")->check(CLI::PositiveNumber);
    app.add_option("--log-every", log_every, "loss line every N steps")->check(CLI::PositiveNumber);
    app.add_option("--svg", svg, "where rank 0 writes the schedule picture of the last step");
    app.add_option("--trace", trace, "where rank 0 writes the Chrome trace of the last step");
    if (const int status = examples::parse_flags(app, ctx.argc(), ctx.argv()); status >= 0)
      return status;
    const auto& train = ctx.config().train;
    const int64_t steps = train.steps, batch = train.batch_size;
    const uint64_t seed = train.seed;
    at::set_num_threads(1);
    auto groups = tandem::make_pipeline_groups(*ctx.mesh());  // parallel.pp stages
    const int dp_rank = groups.data ? groups.data->rank() : 0;
    const int dp_size = groups.data ? groups.data->size() : 1;

    // The same model on every rank (same seed); each keeps only its stage.
    torch::manual_seed(seed);
    torch::nn::Sequential model;
    model->push_back(torch::nn::Linear(32, hidden));
    for (int64_t i = 0; i < layers; ++i) {
      model->push_back(torch::nn::ReLU());
      model->push_back(torch::nn::Linear(hidden, hidden));
    }
    model->push_back(torch::nn::Tanh());
    model->push_back(torch::nn::Linear(hidden, 8));
    model->to(ctx.device());  // train.device
    // A fixed regression task: targets from a random teacher; each data-parallel replica draws
    // its own samples.
    torch::manual_seed(seed + 1);
    auto teacher = torch::nn::Linear(32, 8);
    const int64_t samples = batch * dp_size * 8;
    auto inputs = torch::randn({samples, 32});
    torch::Tensor targets;
    {
      torch::NoGradGuard no_grad;
      targets = torch::tanh(teacher(inputs));
    }
    inputs = inputs.to(ctx.device());
    targets = targets.to(ctx.device());

    tandem::PipelineOptions options = ctx.config().pipeline;  // schedule, microbatches, ...
    if (!schedule_file.empty())
      options.custom_schedule = tandem::pipeline::read_schedule_file(schedule_file);
    tandem::PipelineParallel pipe(model, groups.pipeline, options, groups.data);
    model = nullptr;  // only this rank's stage stays alive
    torch::optim::SGD opt(pipe.parameters(), torch::optim::SGDOptions(train.lr).momentum(0.9));
    const bool last = pipe.local_stages().back() == pipe.schedule().num_stages - 1;
    const bool reporter = last && dp_rank == 0;

    const auto start = std::chrono::steady_clock::now();
    double first_loss = 0, loss_value = 0;
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t b = (step % 8) * dp_size + dp_rank;
      auto x = inputs.narrow(0, b * batch, batch), y = targets.narrow(0, b * batch, batch);
      opt.zero_grad();
      auto loss = pipe.train_step(
          x, y, [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); });
      opt.step();
      if (step == 0) pipe.reset_stats();  // measured costs without the first (warm-up) step
      if (reporter) {
        loss_value = loss.item<double>();
        if (step == 0) first_loss = loss_value;
        if ((step + 1) % log_every == 0 || step + 1 == steps) {
          std::printf("step %5lld  loss %.5f\n", static_cast<long long>(step + 1), loss_value);
          std::fflush(stdout);
        }
      }
    }
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Collective over the pipeline group: measured costs, bubble and the last step's timeline.
    auto costs = pipe.measured_costs();
    const auto bubble = pipe.measured_bubble();
    const auto timeline = pipe.gather_timeline();
    costs.comm = tandem::pipeline::measured_comm_costs({timeline});
    costs.per_action = tandem::pipeline::measured_action_costs(timeline);  // the last step's own
    const auto simulated = tandem::pipeline::simulate(pipe.schedule(), costs);
    double measured = 0;
    for (double b : bubble) measured += b / static_cast<double>(bubble.size());
    if (reporter) {
      std::printf("trained %lld steps in %.2f s (%.1f ms/step): loss %.5f -> %.5f\n",
                  static_cast<long long>(steps), total, 1e3 * total / steps, first_loss,
                  loss_value);
    }
    if (ctx.rank() == 0) {
      tandem::pipeline::write_text_file(
          svg, tandem::pipeline::to_svg(pipe.schedule(), timeline,
                                        pipe.schedule().name + " (measured)"));
      tandem::pipeline::write_text_file(
          trace, tandem::pipeline::to_chrome_trace(pipe.schedule(), timeline));
      std::printf("schedule %s: %d stages, %d microbatches, balance", pipe.schedule().name.c_str(),
                  pipe.schedule().num_stages, pipe.schedule().num_microbatches);
      for (auto n : pipe.balance()) std::printf(" %lld", static_cast<long long>(n));
      std::printf("\nschedule picture: %s\nchrome trace: %s\n", svg.c_str(), trace.c_str());
      std::printf(
          "measured bubble %.3f (last step, mean over ranks); simulated with its costs %.3f\n",
          measured, simulated.mean_own_bubble);
    }
    return 0;
  });
}
