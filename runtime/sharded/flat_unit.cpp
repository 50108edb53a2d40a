#include "runtime/sharded/flat_unit.h"

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include <ATen/ops/empty.h>

namespace tandem::detail {

namespace {

// A storage as large as `flat`'s, with no memory, whose every data access throws.
c10::Storage make_tombstone(const FlatUnit& unit) {
  auto impl = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), unit.flat.nbytes(),
      at::DataPtr(nullptr, unit.flat.device()), /*allocator=*/nullptr, /*resizable=*/false);
  impl->release_data_and_set_meta_custom_data_ptr_error_msg_(
      "tandem: ShardedDataParallel: the parameters of unit '" + unit.name +
      "' are resharded (stage 3 frees each unit's full parameters after its forward and after "
      "backward; only the shards in parameters() hold values between steps). Call "
      "gather_parameters() before reading them (to evaluate, print or save the model), or read "
      "the shards.");
  return c10::Storage(std::move(impl));
}

void point_parameters_at(const FlatUnit& unit, std::vector<at::Tensor>& params,
                         const c10::Storage& storage) {
  for (int64_t p : unit.params) params[p].unsafeGetTensorImpl()->set_storage_keep_dtype(storage);
}

}  // namespace

void FlatUnit::zero_padding(const at::Tensor& flat, const std::vector<at::Tensor>& params) const {
  int64_t end = 0;
  for (size_t k = 0; k <= this->params.size(); ++k) {
    const int64_t next = k < this->params.size() ? offsets[k] : flat.numel();
    if (next > end) flat.narrow(0, end, next - end).zero_();
    if (k < this->params.size()) end = offsets[k] + params[this->params[k]].numel();
  }
}

void allocate_storage(FlatUnit& unit, std::vector<at::Tensor>& params) {
  c10::StorageImpl* storage = unit.flat.storage().unsafeGetStorageImpl();
  const size_t nbytes = unit.flat.nbytes();
  if (storage->nbytes() != nbytes || storage->data() == nullptr) {
    storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
    storage->set_nbytes(nbytes);
  }
  point_parameters_at(unit, params, unit.flat.storage());
}

void free_storage(FlatUnit& unit, std::vector<at::Tensor>& params) {
  if (!unit.tombstone || unit.tombstone.nbytes() != unit.flat.nbytes()) {
    unit.tombstone = make_tombstone(unit);  // (again after mixed precision re-typed `flat`)
  }
  point_parameters_at(unit, params, unit.tombstone);
  c10::StorageImpl* storage = unit.flat.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, unit.flat.device()));
  storage->set_nbytes(0);
}

void copy_without_version_bump(const at::Tensor& dst, const at::Tensor& src) {
  // A fresh TensorImpl over dst's memory has a version counter of its own.
  at::Tensor alias = at::empty({0}, dst.options());
  alias.set_(dst.storage(), dst.storage_offset(), dst.sizes(), dst.strides());
  alias.copy_(src);
}

}  // namespace tandem::detail
