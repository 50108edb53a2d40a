// cuda_device_count() and connect_nccl() (include/tandem/collectives/nccl_communicator.h): they
// reach libtandem_cuda.so (the NCCL communicator and the CUDA memory backends) through dlopen on
// first use, so that libtandem.so itself needs no CUDA library and loads on a machine without one.
#include <tandem/collectives/nccl_communicator.h>

#include <tandem/base/errors.h>

#include "base/companion_library.h"

#include <dlfcn.h>

namespace tandem {
namespace {

struct CudaLibrary {
  void* handle = nullptr;
  std::string error;
};

CudaLibrary load() {
  CudaLibrary lib;
#if defined(TANDEM_CUDA_LIBRARY)
  lib.handle = open_companion_library(TANDEM_CUDA_LIBRARY, RTLD_NOW | RTLD_GLOBAL, &lib.error);
  if (lib.handle == nullptr) {
    lib.error += " (are the CUDA runtime and NCCL installed on this machine?)";
  }
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
