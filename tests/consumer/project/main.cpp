// An out-of-tree user of tandem: only find_package(tandem), the public headers and a key of its
// own in tandem's config. A world of one through tandem::run_main and the Context proves headers,
// library and package config fit together; it also says whether a CUDA library got loaded, so
// run_consumer.sh can show the library runs where none exists.
#include <tandem/tandem.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace {

bool cuda_library_loaded() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("libcudart") != std::string::npos || line.find("libnccl") != std::string::npos)
      return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::register_app_key<int64_t>(
      "app.width", 4, "Elements of the tensor the consumer all-reduces.",
      [](const int64_t& v) { return v > 0; }, "> 0");
  return tandem::run_main(argc, argv, [](tandem::Context& ctx) {
    const int64_t width = ctx.config().app_value<int64_t>("app.width");
    auto t = at::arange(width, at::kFloat);
    ctx.world()->allreduce(t, tandem::ReduceOp::kSum)->wait();
    const bool ok = at::equal(t, at::arange(width, at::kFloat)) && ctx.world_size() == 1;
    std::printf("consumer: %s (%s backend, world %d, app.width %lld, CUDA devices %d, CUDA "
                "libraries loaded: %s)\n",
                ok ? "ok" : "WRONG", ctx.world()->backend().c_str(), ctx.world_size(),
                static_cast<long long>(width), tandem::cuda_device_count(),
                cuda_library_loaded() ? "yes" : "no");
    return ok ? 0 : 1;
  });
}
