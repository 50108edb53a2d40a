// cuda_device_count() and connect_nccl() (include/tandem/collectives/nccl_communicator.h): they
// reach libtandem_cuda.so (the NCCL communicator and the CUDA memory backends) through dlopen on
// first use, so that libtandem.so itself needs no CUDA library and loads on a machine without one.
#include <tandem/collectives/nccl_communicator.h>

#include <tandem/base/errors.h>

#include "base/companion_library.h"

namespace tandem {

int cuda_device_count() {
  using Fn = int (*)();
  auto fn = reinterpret_cast<Fn>(cuda_companion_symbol("tandem_cuda_device_count", nullptr));
  return fn != nullptr ? fn() : 0;  // no CUDA part, runtime or driver: no device to use
}

std::shared_ptr<Communicator> connect_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, const NcclOptions& options) {
  using Fn = void (*)(const c10::intrusive_ptr<c10d::Store>&, int, int, const NcclOptions&,
                      std::shared_ptr<Communicator>&);
  std::string why;
  auto fn = reinterpret_cast<Fn>(cuda_companion_symbol("tandem_cuda_connect_nccl", &why));
  if (fn == nullptr) {
    throw ConfigError("tandem: connect_nccl: " + why + "; use Gloo (--set comm.backend=gloo).");
  }
  std::shared_ptr<Communicator> comm;
  fn(store, rank, size, options, comm);
  return comm;
}

}  // namespace tandem
