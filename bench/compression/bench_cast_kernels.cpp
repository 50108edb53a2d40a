// The float16 / bfloat16 kernels of the cast codecs on one 25 MiB float32 bucket
// (DistributedDataParallel's default bucket size), one thread: each variant of
// collectives/kernels/cast_kernels.h this CPU runs, against the ATen calls the codec falls back to
// (divide, then copy_ into a half tensor: libtorch 2.x refuses div_out across dtypes), and the half-precision sum of reduce_kernels.h against
// the float32 one and the element-wise c10 loop it replaced. scripts/bench-compression runs it and
// puts its JSON under "kernels".
//   bench_cast_kernels [--rounds N] [--out FILE]
// Every measurement is repeated in N interleaved rounds (each round runs all of them in turn);
// the figure is the median in ms, and GB/s of float32 data (4 bytes per element).
#include "collectives/kernels/cast_kernels.h"
#include "collectives/kernels/reduce_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using tandem::kernels::Isa;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"float16/bfloat16 cast and reduction kernels vs ATen, one 25 MiB bucket"};
  int rounds = 15;
  std::string out;
  app.add_option("--rounds", rounds, "interleaved rounds")->check(CLI::PositiveNumber);
  app.add_option("--out", out, "JSON file (empty: stdout only)");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);

  const int64_t n = 25 * 1024 * 1024 / 4;
  const at::Tensor x = at::randn({n});
  at::Tensor y = at::empty({n});
  at::Tensor half = at::empty({n}, at::kHalf), bf16 = at::empty({n}, at::kBFloat16);
  at::Tensor half2 = (x * 0.5).to(at::kHalf), bf162 = (x * 0.5).to(at::kBFloat16);
  const at::Tensor y32 = at::randn({n});
  auto* h = static_cast<uint16_t*>(half.data_ptr());
  auto* b = static_cast<uint16_t*>(bf16.data_ptr());
  const float* xs = x.data_ptr<float>();
  float* ys = y.data_ptr<float>();

  // name -> what one repetition does
  std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"aten/to_half_div2", [&] { half.copy_(x / 2); }},
      {"aten/to_bf16_div2", [&] { bf16.copy_(x / 2); }},
      {"aten/to_half", [&] { half.copy_(x); }},
      {"aten/to_bf16", [&] { bf16.copy_(x); }},
      {"aten/from_half", [&] { y.copy_(half); }},
      {"aten/from_bf16", [&] { y.copy_(bf16); }},
      {"memcpy_float32", [&] { std::memcpy(ys, xs, n * 4); }},
  };
  for (Isa isa : tandem::kernels::kAllIsas) {
    if (!tandem::kernels::isa_supported(isa)) continue;
    const auto& k = tandem::kernels::cast_kernels(isa);
    const std::string p = std::string(tandem::kernels::isa_name(isa)) + "/";
    cases.push_back({p + "to_half_div2", [&k, &x, h, xs] { k.to_half(xs, h, x.numel(), 2.0f); }});
    cases.push_back({p + "to_bf16_div2", [&k, &x, b, xs] { k.to_bf16(xs, b, x.numel(), 2.0f); }});
    cases.push_back({p + "from_half", [&k, &x, h, ys] { k.from_half(h, ys, x.numel()); }});
    cases.push_back({p + "from_bf16", [&k, &x, b, ys] { k.from_bf16(b, ys, x.numel()); }});
  }
  // Reductions as the shared-memory all-reduce runs them: out = a + b over the bucket.
  auto sum = [&](at::ScalarType dtype, const at::Tensor& a, const at::Tensor& c, at::Tensor& o) {
    tandem::detail::reduce_kernel(dtype, tandem::ReduceOp::kSum)(
        o.data_ptr(), a.data_ptr(), c.data_ptr(), static_cast<size_t>(n));
  };
  at::Tensor half_out = at::empty({n}, at::kHalf), bf16_out = at::empty({n}, at::kBFloat16);
  // The element-wise loop reduce_kernels.cpp ran before (c10::Half converted one at a time).
  auto scalar_sum = [&](auto* type, const at::Tensor& a, const at::Tensor& c, at::Tensor& o) {
    using T = std::remove_pointer_t<decltype(type)>;
    T* out = static_cast<T*>(o.data_ptr());
    const T* p = static_cast<const T*>(a.data_ptr());
    const T* q = static_cast<const T*>(c.data_ptr());
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<float>(p[i]) + static_cast<float>(q[i]));
  };
  cases.push_back({"c10_scalar/sum_half", [&] { scalar_sum(static_cast<c10::Half*>(nullptr), half, half2, half_out); }});
  cases.push_back({"c10_scalar/sum_bf16", [&] { scalar_sum(static_cast<c10::BFloat16*>(nullptr), bf16, bf162, bf16_out); }});
  cases.push_back({"sum_float32", [&] { sum(at::kFloat, x, y32, y); }});
  cases.push_back({"sum_half", [&] { sum(at::kHalf, half, half2, half_out); }});
  cases.push_back({"sum_bf16", [&] { sum(at::kBFloat16, bf16, bf162, bf16_out); }});

  std::map<std::string, std::vector<double>> ms;
  for (auto& c : cases) c.second();  // warm-up: pages, caches
  for (int r = 0; r < rounds; ++r) {
    for (auto& [name, run] : cases) {
      const auto start = std::chrono::steady_clock::now();
      run();
      ms[name].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
  }

  std::ostringstream j;
  j << "{\"bucket_bytes\": " << n * 4 << ", \"rounds\": " << rounds << ", \"best_isa\": \""
    << tandem::kernels::isa_name(tandem::kernels::best_isa()) << "\", \"ms\": {";
  bool first = true;
  std::printf("%-28s %9s %8s\n", "kernel (25 MiB bucket)", "ms", "GB/s");
  for (const auto& [name, run] : cases) {
    const double m = median(ms[name]);
    std::printf("%-28s %9.3f %8.2f\n", name.c_str(), m, n * 4 / m / 1e6);
    char num[32];
    std::snprintf(num, sizeof num, "%.4f", m);
    j << (first ? "" : ", ") << "\"" << name << "\": " << num;
    first = false;
  }
  j << "}}\n";
  if (!out.empty()) std::ofstream(out) << j.str();
  return 0;
}
