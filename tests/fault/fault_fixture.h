// The fixture of the fault-injection tests (tests/fault/*_test.cpp): a fresh directory per test,
// tandemrun with 2 workers of fault_worker on loopback, and the parameters of an uninterrupted run
// (computed once per build of the worker, cached in the build tree).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/launcher/tandemrun_process.h"

namespace tandem::launcher_test {

namespace fs = std::filesystem;

inline constexpr int kSteps = 12;
inline constexpr int kEvery = 3;

// A fresh directory per test, removed at the end.
class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tandem_fault_XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  static std::vector<std::string> env_with(const std::vector<std::string>& extra) {
    std::vector<std::string> env = clean_env();
    env.push_back("TANDEM_TIMEOUT_S=30");
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
  }

  // tandemrun --nproc-per-node 2 --standalone [launcher_args] fault_worker --ckpt --out [worker].
  RunResult run(const std::string& name, const std::vector<std::string>& launcher_args,
                const std::vector<std::string>& fault_env,
                const std::vector<std::string>& worker_args = {}, int nproc = 2) {
    std::vector<std::string> args{"--nproc-per-node", std::to_string(nproc), "--standalone",
                                  "--grace-period-s", "3"};
    args.insert(args.end(), launcher_args.begin(), launcher_args.end());
    args.insert(args.end(), {worker_path(), "--ckpt", dir_ + "/" + name + ".ckpt", "--out",
                             dir_ + "/" + name + ".params", "--steps", std::to_string(kSteps),
                             "--every", std::to_string(kEvery)});
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    return run_tandemrun(args, env_with(fault_env), 40s);
  }

  std::string params(const std::string& name) const {
    return read_file(dir_ + "/" + name + ".params");
  }

  // OpenBLAS's kernels differ in the last bits per core type: a reference holds for one only.
  static std::string blas_core_type() {
    const char* type = std::getenv("OPENBLAS_CORETYPE");
    return type != nullptr && *type != '\0' ? type : "native";
  }

  // The parameters of an uninterrupted run (computed once per build of the worker and cached in
  // the build tree, shared by the tests across processes through a lock).
  std::string reference() {
    struct stat st {};
    EXPECT_EQ(::stat(worker_path().c_str(), &st), 0);
    const std::string cache =
        std::string(FAULT_CACHE_DIR) + "/reference_" + std::to_string(st.st_mtim.tv_sec) + "_" +
        std::to_string(st.st_mtim.tv_nsec) + "_" + std::to_string(st.st_size) + "_" +
        blas_core_type() + ".params";
    const int lock = ::open((std::string(FAULT_CACHE_DIR) + "/reference.lock").c_str(),
                            O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    EXPECT_GE(lock, 0);
    ::flock(lock, LOCK_EX);
    std::string bytes = read_file(cache);
    if (bytes.empty()) {
      const RunResult r = run("reference", {}, {});
      EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
      bytes = params("reference");
      EXPECT_FALSE(bytes.empty());
      std::ofstream(cache + ".tmp", std::ios::binary) << bytes;
      // Older references (of earlier builds of the worker) go.
      std::error_code ignored;
      for (const auto& entry : fs::directory_iterator(FAULT_CACHE_DIR, ignored)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("reference_", 0) == 0 && entry.path().extension() == ".params")
          fs::remove(entry.path(), ignored);
      }
      fs::rename(cache + ".tmp", cache);
    }
    ::close(lock);  // releases the lock
    return bytes;
  }

  std::string dir_;
};

}  // namespace tandem::launcher_test
