// A shared library that a Python process loads with ctypes beside torch.distributed: tandem's Gloo
// collectives run in the same process as libtorch's own Gloo (test_gloo_side_by_side.py).
//   int tandem_side_by_side(int rank, int world, const char* host, int port, char* error, int size)
// connects a c10d::TCPStore client to torch's store at host:port, then runs tandem's Gloo
// (shared memory off, so every op goes over libgloo's TCP) through every collective, op and
// dtype, checking each result exactly. Returns 0, or 1 with the first failure in `error`.
#include <tandem/tandem.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <cstring>
#include <string>

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// Every rank holds (rank + 1) * (i % 7 + 1) at element i: sums, maxima and the gathered rows are
// small integers, exact in every dtype.
at::Tensor filled(int rank, int64_t n, at::ScalarType dtype) {
  auto i = at::arange(n, at::kLong).remainder(7).add(1);
  return i.mul(rank + 1).to(dtype);
}

void run(int rank, int world, const std::string& host, int port) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = false;
  opts.numWorkers = world;
  opts.waitWorkers = false;
  auto store = c10::make_intrusive<c10d::TCPStore>(host, opts);
  tandem::GlooOptions gloo;
  gloo.shared_memory = false;  // every op over TCP, i.e. through tandem's libgloo
  gloo.store_prefix = "tandem-side-by-side";
  gloo.timeout = std::chrono::seconds(60);
  auto comm = tandem::connect_gloo(store, rank, world, gloo);
  const int64_t n = 1000;  // above and below nothing: bcube and ring are both taken below
  const int64_t tri = static_cast<int64_t>(world) * (world + 1) / 2;
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte,
                     at::kShort, at::kInt, at::kLong}) {
    const std::string name = c10::toString(dtype);
    for (int64_t elems : {n, int64_t{100000}}) {  // bcube below 256 KiB, ring above
      auto t = filled(rank, elems, dtype);
      comm->allreduce(t, tandem::ReduceOp::kSum)->wait();
      check(t.to(at::kDouble).equal(filled(0, elems, at::kDouble).mul(tri)),
            "allreduce sum " + name + " of " + std::to_string(elems));
      auto m = filled(rank, elems, dtype);
      comm->allreduce(m, tandem::ReduceOp::kMax)->wait();
      check(m.to(at::kDouble).equal(filled(world - 1, elems, at::kDouble)), "allreduce max " + name);
    }
    auto b = rank == world - 1 ? filled(rank, n, dtype) : at::zeros({n}, dtype);
    comm->broadcast(b, world - 1)->wait();
    check(b.equal(filled(world - 1, n, dtype)), "broadcast " + name);
    auto out = at::empty({world * n}, dtype);
    comm->allgather(out, filled(rank, n, dtype))->wait();
    for (int r = 0; r < world; ++r) {
      check(out.narrow(0, r * n, n).equal(filled(r, n, dtype)), "allgather " + name);
    }
    auto chunk = at::empty({n}, dtype);
    comm->reduce_scatter(chunk, filled(rank, world * n, dtype), tandem::ReduceOp::kSum)->wait();
    check(chunk.to(at::kDouble).equal(
              filled(0, world * n, at::kDouble).narrow(0, rank * n, n).mul(tri)),
          "reduce_scatter " + name);
  }
  // Point to point around the ring, then a barrier.
  auto sent = filled(rank, n, at::kFloat);
  auto got = at::empty({n}, at::kFloat);
  auto s = comm->send(sent, (rank + 1) % world, 7);
  auto r = comm->recv(got, (rank + world - 1) % world, 7);
  s->wait();
  r->wait();
  check(got.equal(filled((rank + world - 1) % world, n, at::kFloat)), "send/recv");
  comm->barrier()->wait();
}

}  // namespace

extern "C" int tandem_side_by_side(int rank, int world, const char* host, int port, char* error,
                                   int size) {
  try {
    run(rank, world, host, port);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, static_cast<size_t>(size), "%s", e.what());
    return 1;
  }
}
