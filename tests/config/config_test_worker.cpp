// A training program's shape, for the config process tests: tandem::run_main with a Context.
// Prints what it got (config values, rank, the program's own arguments) and all-reduces once, so
// a test sees the world was connected.
#include <tandem/tandem.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
    if (std::getenv("CONFIG_TEST_BAD_INPUT") != nullptr) {
      // A CommError of bad input (an integer average): raised by the call, nothing sent.
      ctx.world()->allreduce(at::ones({2}, at::kInt), tandem::ReduceOp::kAvg);
    }
    at::Tensor t = at::full({1}, static_cast<double>(ctx.rank() + 1), at::kDouble);
    ctx.world()->allreduce(t)->wait();
    std::string args;
    for (int i = 1; i < ctx.argc(); ++i) args += std::string(i > 1 ? " " : "") + ctx.argv()[i];
    std::printf("worker rank=%d/%d sum=%g bucket_cap_mb=%g steps=%lld codec=%s from=%s args=[%s]\n",
                ctx.rank(), ctx.world_size(), t.item<double>(), ctx.config().ddp.bucket_cap_mb,
                static_cast<long long>(ctx.config().train.steps),
                ctx.config().ddp.codec ? ctx.config().ddp.codec->name().c_str() : "none",
                ctx.config_sources().count("ddp.bucket_cap_mb") ? ctx.config_sources().at("ddp.bucket_cap_mb").c_str()
                                                               : "default",
                args.c_str());
    std::printf("worker local=%d/%d restarts=%d\n", ctx.local_rank(), ctx.local_world_size(), ctx.restart_count());
    std::fflush(stdout);
  });
}
