// Worker of the flight-recorder process tests, started by tandemrun: ten all-reduces of a small
// tensor, each waited, then
//   --mode behind     rank 1 stops after the fifth (it sleeps): the others time out in the sixth
//   --mode mismatch   rank 1 issues a broadcast where the others issue the sixth all-reduce
//   --mode idle       every rank finishes the ten, then waits to be signalled (SIGUSR1 dumps)
//   --mode stop       rank 1 stops itself (SIGSTOP) after the fifth: the others time out in the
//                     sixth, and tandemrun reads rank 1's ring, as it cannot dump
// Use a short --set comm.timeout_s.
#include <tandem/tandem.h>

#include <CLI/CLI.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

int main(int argc, char** argv) {
  return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
    CLI::App app{"flight-recorder test worker"};
    std::string mode = "behind";
    app.add_option("--mode", mode)->check(CLI::IsMember({"behind", "mismatch", "idle", "stop"}));
    app.parse(ctx.argc(), ctx.argv());
    auto& world = *ctx.world();
    for (int i = 0; i < 10; ++i) {
      const bool odd_one = ctx.rank() == 1 && i == 5;
      if (odd_one && mode == "behind") std::this_thread::sleep_for(std::chrono::seconds(60));
      if (odd_one && mode == "stop") ::raise(SIGSTOP);
      auto t = at::ones({16 + i});
      if (odd_one && mode == "mismatch") {
        world.broadcast(t, 0)->wait();
      } else {
        world.allreduce(t)->wait();
      }
    }
    std::printf("ready pid=%d\n", static_cast<int>(::getpid()));
    std::fflush(stdout);
    if (mode == "idle") std::this_thread::sleep_for(std::chrono::seconds(60));
  });
}
