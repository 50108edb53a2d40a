// Internal (libtandem_cuda): selects a CUDA device for a scope and restores the caller's, so the
// CUDA memory code can be called from any thread whatever device that thread has selected.
#pragma once

#include <cuda_runtime_api.h>

namespace tandem::memory {

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~CudaDeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace tandem::memory
