// cuda_device_count() and connect_nccl() (include/tandem/collectives/nccl_communicator.h): they
// reach libtandem_cuda.so (the NCCL communicator and the CUDA memory backends) through dlopen on
// first use, so that libtandem.so itself needs no CUDA library and loads on a machine without one.
#include <tandem/collectives/nccl_communicator.h>

#include <tandem/base/errors.h>

#include <dlfcn.h>

namespace tandem {
namespace {

void* cuda_library_symbol(const char* symbol, std::string* why);

struct CudaLibrary {
  void* handle = nullptr;
  std::string error;
};

// Beside libtandem.so first (the build tree and an install prefix keep them together), then by
// the loader's search path.
CudaLibrary load() {
  CudaLibrary lib;
#if defined(TANDEM_CUDA_LIBRARY)
  std::string candidates[2] = {"", TANDEM_CUDA_LIBRARY};
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&cuda_library_symbol), &self) != 0 && self.dli_fname) {
    const std::string path = self.dli_fname;
    const auto slash = path.rfind('/');
    if (slash != std::string::npos) candidates[0] = path.substr(0, slash + 1) + TANDEM_CUDA_LIBRARY;
  }
  for (const std::string& candidate : candidates) {
    if (candidate.empty()) continue;
    lib.handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (lib.handle != nullptr) return lib;
    lib.error = ::dlerror();
  }
  lib.error = "cannot load " + std::string(TANDEM_CUDA_LIBRARY) + ": " + lib.error +
              " (are the CUDA runtime and NCCL installed on this machine?)";
#else
  lib.error = "this build of tandem has no CUDA part (configure it where the CUDA toolkit and "
              "NCCL are installed)";
#endif
  return lib;
}

void* cuda_library_symbol(const char* symbol, std::string* why) {
  static const CudaLibrary lib = load();
  if (lib.handle == nullptr) {
    if (why != nullptr) *why = lib.error;
    return nullptr;
  }
  void* address = ::dlsym(lib.handle, symbol);
  if (address == nullptr && why != nullptr) *why = "libtandem_cuda has no " + std::string(symbol);
  return address;
}

}  // namespace

int cuda_device_count() {
  using Fn = int (*)();
  auto fn = reinterpret_cast<Fn>(cuda_library_symbol("tandem_cuda_device_count", nullptr));
  return fn != nullptr ? fn() : 0;  // no CUDA part, runtime or driver: no device to use
}

std::shared_ptr<Communicator> connect_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, const NcclOptions& options) {
  using Fn = void (*)(const c10::intrusive_ptr<c10d::Store>&, int, int, const NcclOptions&,
                      std::shared_ptr<Communicator>&);
  std::string why;
  auto fn = reinterpret_cast<Fn>(cuda_library_symbol("tandem_cuda_connect_nccl", &why));
  if (fn == nullptr) {
    throw ConfigError("tandem: connect_nccl: " + why + "; use Gloo (--set comm.backend=gloo).");
  }
  std::shared_ptr<Communicator> comm;
  fn(store, rank, size, options, comm);
  return comm;
}

}  // namespace tandem
