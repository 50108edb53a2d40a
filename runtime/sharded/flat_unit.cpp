#include "runtime/sharded/flat_unit.h"

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include <ATen/ops/empty.h>

namespace tandem::detail {

void allocate_storage(const at::Tensor& flat) {
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(flat.numel()) * flat.element_size();
  if (storage->nbytes() == nbytes && storage->data() != nullptr) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

void free_storage(const at::Tensor& flat) {
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, flat.device()));
  storage->set_nbytes(0);
}

void copy_without_version_bump(const at::Tensor& dst, const at::Tensor& src) {
  // A fresh TensorImpl over dst's memory has a version counter of its own.
  at::Tensor alias = at::empty({0}, dst.options());
  alias.set_(dst.storage(), dst.storage_offset(), dst.sizes(), dst.strides());
  alias.copy_(src);
}

}  // namespace tandem::detail
