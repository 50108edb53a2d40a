// Host buffers for checkpoint data (see checkpoint/host_buffer.h).
#include "checkpoint/host_buffer.h"

#include <tandem/base/errors.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>

#include <sys/mman.h>

#include <cstdlib>
#include <string>

namespace tandem::detail {

at::Tensor host_buffer(at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t numel = 1;
  for (const auto d : shape) numel *= d;
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  constexpr size_t kHuge = size_t{2} << 20;
  if (nbytes < kHuge) return at::empty(shape, dtype);
  const size_t rounded = (nbytes + kHuge - 1) / kHuge * kHuge;
  void* p = nullptr;
  if (posix_memalign(&p, kHuge, rounded) != 0 || p == nullptr) {
    throw CheckpointError("tandem: checkpoint: cannot allocate " + std::to_string(nbytes) +
                          " bytes of host memory for checkpoint data.");
  }
#ifdef MADV_HUGEPAGE
  ::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
  return at::from_blob(p, shape, [](void* q) { std::free(q); }, at::TensorOptions().dtype(dtype));
}

}  // namespace tandem::detail
