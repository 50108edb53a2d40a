// A world of one through the public API: proves headers, library and package config fit together.
#include <tandem/tandem.h>

#include <ATen/ATen.h>

#include <cstdio>

int main() {
  auto dist = tandem::init();
  auto t = at::arange(4, at::kFloat);
  dist.world->allreduce(t, tandem::ReduceOp::kSum)->wait();
  const bool ok = at::equal(t, at::arange(4, at::kFloat)) && dist.world->size() == 1;
  std::printf("consumer: %s (%s backend, world %d)\n", ok ? "ok" : "WRONG",
              dist.world->backend().c_str(), dist.world->size());
  return ok ? 0 : 1;
}
