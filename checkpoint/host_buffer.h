// Host memory for the async writer's staging buffers, reused by every save. Not installed.
//
// Ownership: the returned tensor owns its memory (freed with the last reference).
// Thread-safety: reentrant.
// Errors: CheckpointError when the memory cannot be allocated.
#pragma once

#include <ATen/core/Tensor.h>

namespace tandem::detail {

// An uninitialised CPU tensor. Buffers of 2 MiB and more are 2 MiB aligned and advised to use
// transparent huge pages, which cuts the first-touch page-fault cost of a fresh GiB several-fold.
at::Tensor host_buffer(at::IntArrayRef shape, at::ScalarType dtype);

}  // namespace tandem::detail
