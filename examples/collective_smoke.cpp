// collective_smoke: every collective across the ranks started by tandemrun, checked against the
// expected values, with allreduce timings. The README's main job until data-parallel training
// replaces it.
//
//   tandemrun --standalone --nproc-per-node 2 build/bin/collective_smoke [--iterations 20]
#include <tandem/tandem.h>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>

#include "examples/cli.h"

namespace {

using Clock = std::chrono::steady_clock;

void require(bool ok, const char* what) {
  if (!ok) throw tandem::Error(std::string("collective_smoke: wrong result from ") + what);
}

// Median-free, simple mean over `iterations` allreduces of `bytes` bytes; returns seconds/op.
double time_allreduce(tandem::Communicator& comm, int64_t bytes, int iterations,
                      const c10::Device& device) {
  auto t = at::ones({bytes / 4}, at::TensorOptions(at::kFloat).device(device));
  comm.allreduce(t)->wait();  // warm-up (connections, page faults)
  comm.barrier()->wait();
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) comm.allreduce(t)->wait();
  return std::chrono::duration<double>(Clock::now() - start).count() / iterations;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("tandem collective smoke test: run under tandemrun");
  int iterations = 20;
  app.add_option("--iterations", iterations, "allreduce repetitions per size")->check(CLI::PositiveNumber);
  std::string device_spec = "cpu";
  app.add_option("--device", device_spec, "where the tensors live: cpu | cuda | cuda:N | auto");
  if (const int status = examples::parse_flags(app, argc, argv); status >= 0) return status;

  try {
    auto dist = tandem::init();
    auto& comm = *dist.world;
    const int n = comm.size();
    const int r = comm.rank();
    std::printf("connected: %s\n", dist.env.describe().c_str());
    const c10::Device device = tandem::resolve_train_device(
        device_spec, dist.env.local_rank, device_spec == "cpu" ? 0 : tandem::cuda_device_count());
    const auto on = [&](const at::Tensor& t) { return t.to(device); };
    const auto host = [](const at::Tensor& t) { return t.cpu(); };

    auto sum = on(at::full({1 << 20}, float(r + 1)));
    comm.allreduce(sum, tandem::ReduceOp::kSum)->wait();
    require(at::equal(host(sum), at::full({1 << 20}, float(n * (n + 1) / 2))), "allreduce(sum)");
    auto bf16 = on(at::full({4096}, r + 1, at::kBFloat16));
    comm.allreduce(bf16, tandem::ReduceOp::kAvg)->wait();
    require(at::allclose(host(bf16).to(at::kFloat), at::full({4096}, (n + 1) / 2.0f)), "allreduce(bf16 avg)");
    auto root_value = on(at::full({1000}, float(r)));
    comm.broadcast(root_value, 0)->wait();
    require(at::equal(host(root_value), at::zeros({1000})), "broadcast");
    auto gathered = on(at::empty({n * 3}, at::kLong));
    comm.allgather(gathered, on(at::full({3}, int64_t(r), at::kLong)))->wait();
    require(at::equal(host(gathered), at::arange(n, at::kLong).repeat_interleave(3)), "allgather");
    auto part = on(at::empty({5}));
    comm.reduce_scatter(part, on(at::ones({n * 5})))->wait();
    require(at::equal(host(part), at::full({5}, float(n))), "reduce_scatter");
    if (n > 1) {
      auto token = on(at::full({8}, float(r)));
      auto incoming = on(at::empty({8}));
      auto s = comm.send(token, (r + 1) % n);
      auto q = comm.recv(incoming, (r + n - 1) % n);
      s->wait();
      q->wait();
      require(at::equal(host(incoming), at::full({8}, float((r + n - 1) % n))), "send/recv ring");
    }
    comm.barrier()->wait();
    std::printf("rank %d: allreduce, broadcast, allgather, reduce_scatter, send/recv, barrier verified\n", r);

    for (int64_t bytes : {int64_t(4) << 10, int64_t(1) << 20, int64_t(16) << 20}) {
      const double s = time_allreduce(comm, bytes, iterations, device);
      const double busbw = n > 1 ? bytes / s * 2.0 * (n - 1) / n / 1e9 : 0.0;
      if (r == 0) {
        std::printf("allreduce %8.0f KiB: %8.3f ms  bus bandwidth %6.2f GB/s\n", bytes / 1024.0,
                    s * 1e3, busbw);
      }
    }
    comm.barrier()->wait();
    if (r == 0) std::printf("collective_smoke: all collectives verified on %d ranks\n", n);
    return 0;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
