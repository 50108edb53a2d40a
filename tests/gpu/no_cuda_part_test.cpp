// A CUDA model where tandem has no CUDA part (issue 26 item 7): every request for CUDA is a
// ConfigError saying what to set, never a crash. libtandem loads its CUDA part, libtandem_cuda,
// from its own directory on first use; the worker runs with a libtandem found (LD_LIBRARY_PATH)
// in a directory without it, which takes the same path as a build without one (no library
// handle). The same worker with the library in place is the control: everything works there.
#include "tests/launcher/tandemrun_process.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace tandem::launcher_test {
namespace {

constexpr int kNoGpu = 77;  // the worker's exit code when torch sees no CUDA device

RunResult run_worker(const std::vector<std::string>& env) {
  TandemrunProcess p({worker_path()}, env, /*through_tandemrun=*/false);
  return p.finish(60s);
}

bool has_line(const std::string& out, const std::string& prefix, const std::string& text) {
  for (const auto& line : split_lines(out)) {
    if (line.rfind(prefix, 0) == 0 && line.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(NoCudaPart, EveryCudaRequestIsAConfigErrorThatSaysWhatToSet) {
  const RunResult control = run_worker(clean_env());
  ASSERT_FALSE(control.timed_out) << control.out << control.err;
  if (control.exit_code == kNoGpu) GTEST_SKIP() << "no CUDA device: " << control.out;
  ASSERT_EQ(control.exit_code, 0) << control.out << control.err;
  EXPECT_FALSE(has_line(control.out, "cuda_device_count: ", "cuda_device_count: 0")) << control.out;
  for (const char* request : {"comm.backend=nccl: ", "train.device=cuda: ",
                              "cuda model, train.device=auto: "}) {
    EXPECT_TRUE(has_line(control.out, request, ": ok")) << request << "\n" << control.out;
  }

  // libtandem (and its Gloo) alone in a directory that LD_LIBRARY_PATH puts first.
  TempDir dir("no-cuda-part");
  std::filesystem::create_symlink(TANDEM_LIBRARY_FILE, dir.path + "/" TANDEM_LIBRARY_SONAME);
  const std::filesystem::path gloo(TANDEM_GLOO_LIBRARY_FILE);
  std::filesystem::create_symlink(gloo, dir.path + "/" + gloo.filename().string());
  std::vector<std::string> env;
  std::string library_path = dir.path;
  for (const auto& e : clean_env()) {
    if (e.rfind("LD_LIBRARY_PATH=", 0) == 0) {
      library_path += ":" + e.substr(16);
    } else {
      env.push_back(e);
    }
  }
  env.push_back("LD_LIBRARY_PATH=" + library_path);
  const RunResult hidden = run_worker(env);
  ASSERT_FALSE(hidden.timed_out) << hidden.out << hidden.err;
  ASSERT_EQ(hidden.exit_code, 0) << hidden.out << hidden.err;
  EXPECT_TRUE(has_line(hidden.out, "cuda_device_count: ", "cuda_device_count: 0")) << hidden.out;
  EXPECT_TRUE(has_line(hidden.out, "comm.backend=nccl: ",
                       "comm.backend = nccl, but this process has no usable CUDA device (or "
                       "this build of tandem has no CUDA part"))
      << hidden.out;
  EXPECT_TRUE(has_line(hidden.out, "train.device=cuda: ",
                       "train.device is cuda, but this process has no usable CUDA device"))
      << hidden.out;
  EXPECT_TRUE(has_line(hidden.out, "train.device=cuda: ", "--set train.device=cpu")) << hidden.out;
  EXPECT_TRUE(has_line(hidden.out, "cuda model, train.device=auto: ",
                       "parameter 'in.weight' is on cuda:0 but train.device is cpu"))
      << hidden.out;
}

}  // namespace
}  // namespace tandem::launcher_test
