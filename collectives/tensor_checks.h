// Internal: argument checks shared by the communicator backends. Each throws CommError whose
// message names the op, the argument, the value seen and what to do.
#pragma once

#include <tandem/collectives/communicator.h>

#include <string>

namespace tandem::detail {

// Defined, dense and of a dtype collectives support: what Communicator's operations check of every
// tensor argument before the backend sees it.
void check_collective_tensor(const at::Tensor& t, const char* op, const char* arg);
// check_collective_tensor(), and on `device` (CPU for gloo, CUDA for nccl).
void check_tensor(const at::Tensor& t, const char* op, const char* arg, c10::DeviceType device,
                  const char* backend);
// kAvg only for floating dtypes.
void check_reduce_op(const at::Tensor& t, ReduceOp reduce, const char* op);
// `big` must hold exactly `factor` times the elements of `small`, with the same dtype.
void check_scaled_numel(const at::Tensor& big, const char* big_name, const at::Tensor& small,
                        const char* small_name, int64_t factor, const char* op);
// Rank in [0, size) and, for point-to-point, not this rank.
void check_peer(int peer, int size, const char* op, const char* arg);
// "float32", "bfloat16", "int64": the names users know from PyTorch.
std::string dtype_name(at::ScalarType dtype);
// "4.00 MiB float32" (nbytes and dtype).
std::string tensor_summary(const at::Tensor& t);
// "[0, 1, 3]".
std::string format_ranks(const std::vector<int>& ranks);

}  // namespace tandem::detail
