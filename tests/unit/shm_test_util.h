// Shared by the shared-memory all-reduce tests (shm_allreduce_test.cpp: ranks as threads,
// shm_allreduce_process_test.cpp: ranks as processes): options, and what a process has mapped or
// left in /dev/shm.
#pragma once

#include <tandem/collectives/gloo_communicator.h>

#include <dirent.h>
#include <sys/types.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

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

}  // namespace tandem::shm_test
