#include "base/companion_library.h"

#include <dlfcn.h>

namespace tandem {

void* open_companion_library(const std::string& file_name, int flags, std::string* error) {
  std::string candidates[2] = {"", file_name};
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&open_companion_library), &self) != 0 && self.dli_fname) {
    const std::string path = self.dli_fname;
    const auto slash = path.rfind('/');
    if (slash != std::string::npos) candidates[0] = path.substr(0, slash + 1) + file_name;
  }
  std::string why;
  for (const std::string& candidate : candidates) {
    if (candidate.empty()) continue;
    if (void* handle = ::dlopen(candidate.c_str(), flags)) return handle;
    const char* reason = ::dlerror();
    // The first failure says more (a missing dependency) than "not found in the search path".
    if (why.empty() && reason != nullptr) why = reason;
  }
  if (error != nullptr) *error = "cannot load " + file_name + ": " + why;
  return nullptr;
}

void* cuda_companion_symbol(const char* symbol, std::string* why) {
  struct Library {
    void* handle = nullptr;
    std::string error;
  };
  static const Library lib = [] {
    Library l;
#if defined(TANDEM_CUDA_LIBRARY)
    l.handle = open_companion_library(TANDEM_CUDA_LIBRARY, RTLD_NOW | RTLD_GLOBAL, &l.error);
    if (l.handle == nullptr) l.error += " (are the CUDA runtime and NCCL installed on this machine?)";
#else
    l.error = "this build of tandem has no CUDA part (configure it where the CUDA toolkit and NCCL "
              "are installed)";
#endif
    return l;
  }();
  if (lib.handle == nullptr) {
    if (why != nullptr) *why = lib.error;
    return nullptr;
  }
  void* address = ::dlsym(lib.handle, symbol);
  if (address == nullptr && why != nullptr) {
    *why = "libtandem_cuda has no " + std::string(symbol) + " (a stale build?)";
  }
  return address;
}

}  // namespace tandem
