// Worker program for the multi-process tests: connects with tandem::init() from the environment
// and runs one scenario. Exit codes: 0 scenario passed, 1 scenario failed, 4 ConfigError,
// 5 TimeoutError, 6 CommError, 7 other tandem::Error. Every tandem error is printed as
// "tandem error (<Type>): <message>".
#include "tests/multiprocess/worker_main.h"

#include <tandem/tandem.h>

#include <ATen/ATen.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

namespace {

using Clock = std::chrono::steady_clock;

int verify(tandem::Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong}) {
    auto t = at::full({100003}, r + 1, dtype);
    comm.allreduce(t, tandem::ReduceOp::kSum)->wait();
    if (!at::equal(t, at::full({100003}, n * (n + 1) / 2, dtype))) {
      std::printf("allreduce mismatch for %s\n", c10::toString(dtype));
      return 1;
    }
  }
  auto b = at::full({1000}, float(r));
  comm.broadcast(b, n - 1)->wait();
  auto g = at::zeros({n * 10});
  comm.allgather(g, at::full({10}, float(r)))->wait();
  auto s = at::zeros({10});
  comm.reduce_scatter(s, at::ones({n * 10}))->wait();
  comm.barrier()->wait();
  const bool ok = at::equal(b, at::full({1000}, float(n - 1))) &&
                  at::equal(g, at::arange(n, at::kFloat).repeat_interleave(10)) &&
                  at::equal(s, at::full({10}, float(n)));
  std::printf("%s rank %d of %d\n", ok ? "OK" : "MISMATCH", r, n);
  return ok ? 0 : 1;
}

// Rank 1 dies (SIGKILL) or hangs (SIGSTOP) after the first allreduce; rank 0 must get an error
// from the second allreduce within the timeout.
int peer_fails(tandem::Communicator& comm, int signal) {
  auto t = at::ones({1 << 18});
  comm.allreduce(t)->wait();
  if (comm.rank() == 1) {
    std::fflush(stdout);
    std::raise(signal);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 1;
  }
  const auto start = Clock::now();
  try {
    comm.allreduce(t)->wait();
  } catch (const tandem::TimeoutError& e) {
    std::printf("CAUGHT TimeoutError after %.2f s: %s\n",
                std::chrono::duration<double>(Clock::now() - start).count(), e.what());
    return 0;
  } catch (const tandem::CommError& e) {
    std::printf("CAUGHT CommError after %.2f s: %s\n",
                std::chrono::duration<double>(Clock::now() - start).count(), e.what());
    return 0;
  }
  std::printf("no error although the peer is gone\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("comm_worker: a multi-process test worker (collectives, peer failures)");
  app.require_subcommand(0, 1);  // none: verify
  auto* dies = app.add_subcommand("peer-dies", "rank 1 is SIGKILLed mid-collective");
  auto* hangs = app.add_subcommand("peer-hangs", "rank 1 is SIGSTOPped mid-collective");
  auto* init_only = app.add_subcommand("init-only", "connect and exit 0");
  app.add_subcommand("verify", "check every collective's result (the default)");
  CLI11_PARSE(app, argc, argv);
  return tandem::testing::run_worker([&](tandem::Distributed& dist) {
    if (*dies) return peer_fails(*dist.world, SIGKILL);
    if (*hangs) return peer_fails(*dist.world, SIGSTOP);
    if (*init_only) return 0;
    return verify(*dist.world);
  });
}
