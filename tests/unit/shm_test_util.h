// Shared by the shared-memory collective tests (shm_allreduce_test.cpp and
// shm_reduce_scatter_allgather_test.cpp: ranks as threads, shm_allreduce_process_test.cpp: ranks
// as processes): options, what a process has mapped or left in /dev/shm, inputs, references in
// float64 and the rounding bound results are held to.
#pragma once

#include <tandem/collectives/gloo_communicator.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/types.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace tandem::shm_test {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Mappings of tandem shared-memory segments in this process.
inline int shm_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("/dev/shm/tandem-shm-") != std::string::npos;
  return n;
}

// Names left in /dev/shm by segments that process `pid` created.
inline int shm_files_of(pid_t pid) {
  const std::string prefix = "tandem-shm-" + std::to_string(pid) + "-";
  int n = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) n += std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0;
    ::closedir(d);
  }
  return n;
}

inline GlooOptions shm_options(size_t slot_bytes = GlooOptions().shared_memory_slot_bytes,
                               std::chrono::milliseconds timeout = 60s) {
  GlooOptions o;
  o.shared_memory = true;
  o.shared_memory_slot_bytes = slot_bytes;
  o.timeout = timeout;
  o.store_prefix = "shm";
  return o;
}

inline GlooOptions tcp_options() {
  GlooOptions o;
  o.shared_memory = false;
  o.store_prefix = "tcp";
  return o;
}

// Deterministic inputs. Floats: irregular values of both signs for sums (so rounding differs
// between summation orders), in [0.6, 1.4] for products. Integers: small, so nothing overflows.
inline at::Tensor input_for(int rank, int64_t n, at::ScalarType dtype, ReduceOp op) {
  const auto i = at::arange(n, at::kLong);
  if (at::isFloatingType(dtype)) {
    const auto x = at::sin(i.to(at::kDouble) * 0.7311 + rank * 1.37 + 0.1);
    return (op == ReduceOp::kProduct ? 1.0 + 0.4 * x : 3.0 * x).to(dtype);
  }
  if (op == ReduceOp::kProduct) return ((i + rank) % 3 + 1).to(dtype);
  const auto v = (i * 7 + rank * 13) % 41;
  return (dtype == at::kByte ? v : v - 20).to(dtype);
}

// Reduction in float64 over every rank's input, and the sum of magnitudes (rounding scale).
inline std::pair<at::Tensor, at::Tensor> reference(int world, int64_t n, at::ScalarType dtype,
                                            ReduceOp op) {
  std::vector<at::Tensor> all;
  for (int r = 0; r < world; ++r) all.push_back(input_for(r, n, dtype, op).to(at::kDouble));
  const auto s = at::stack(all);
  at::Tensor v;
  switch (op) {
    case ReduceOp::kSum: v = s.sum(0); break;
    case ReduceOp::kAvg: v = s.mean(0); break;
    case ReduceOp::kMin: v = std::get<0>(s.min(0)); break;
    case ReduceOp::kMax: v = std::get<0>(s.max(0)); break;
    case ReduceOp::kProduct: v = s.prod(0); break;
  }
  at::Tensor scale = op == ReduceOp::kProduct ? v.abs() : s.abs().sum(0);
  if (op == ReduceOp::kAvg) scale = scale / world;
  return {v, scale};
}

inline double epsilon(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return 1.1920929e-07;
    case at::kDouble: return 2.220446049250313e-16;
    case at::kHalf: return 9.765625e-04;
    case at::kBFloat16: return 7.8125e-03;
    default: return 0;
  }
}

inline bool exact(at::ScalarType dtype, ReduceOp op) {
  return !at::isFloatingType(dtype) || op == ReduceOp::kMin || op == ReduceOp::kMax;
}

// The tolerance for results of two summation (or multiplication) orders, and against float64:
// every pairwise step of a p-rank reduction rounds once (16-bit floats round after every step,
// as the Gloo path does), so each result is within (p-1) eps * sum|x_r| of the exact value and
// two orders differ by at most twice that; avg adds one rounding of the quotient. We allow
// 2 p eps * scale + eps |value|, scale = sum|x_r| (sum), sum|x_r| / p (avg), |product| (product).
// Integers, min and max must be exact.
inline void expect_close(const at::Tensor& got, const at::Tensor& want, const at::Tensor& scale,
                  int world, at::ScalarType dtype, ReduceOp op, const std::string& what) {
  if (exact(dtype, op)) {
    EXPECT_TRUE(at::equal(got.to(at::kDouble), want.to(at::kDouble))) << what;
    return;
  }
  ASSERT_EQ(got.numel(), want.numel()) << what;
  if (got.numel() == 0) return;
  const double eps = epsilon(dtype);
  const auto g = got.to(at::kDouble);
  const auto w = want.to(at::kDouble);
  const auto bound = 2.0 * world * eps * scale + eps * w.abs() + 1e-300;
  const auto excess = ((g - w).abs() - bound).max().item<double>();
  EXPECT_LE(excess, 0.0) << what;
}

inline std::string label(at::ScalarType dtype, ReduceOp op, int64_t n, int rank) {
  return std::string(to_string(op)) + " " + c10::toString(dtype) + " n=" + std::to_string(n) +
         " rank " + std::to_string(rank);
}

}  // namespace tandem::shm_test
