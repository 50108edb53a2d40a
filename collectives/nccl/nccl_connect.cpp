// How NCCL communicators come to be (libtandem_cuda): the world's from the unique id rank 0 puts
// in the store, and a split's members from an op of its parent; and libtandem_cuda's entry points,
// found by libtandem.so with dlsym (collectives/cuda_library.cpp).
#include "collectives/nccl/nccl_comm.h"
#include "collectives/nccl/nccl_op.h"

#include <tandem/base/errors.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cstring>

namespace tandem::detail {

std::pair<std::vector<int>, int> split_members(Communicator& parent, int device, int color,
                                               int key, const std::vector<int>& world_ranks) {
  const at::TensorOptions longs = at::TensorOptions(at::kLong).device(at::kCUDA, device);
  const at::Tensor mine = at::tensor({int64_t{color}, int64_t{key}}, at::kLong).to(longs);
  const at::Tensor all = at::empty({2 * parent.size()}, longs);
  parent.allgather(all, mine)->wait(parent.timeout());  // on the host: read below
  const at::Tensor host = all.cpu();
  const int64_t* v = host.data_ptr<int64_t>();
  std::vector<int> members;  // ordered by (key, rank), as ncclCommSplit orders them
  for (int r = 0; r < parent.size(); ++r) {
    if (color >= 0 && v[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return v[2 * a + 1] < v[2 * b + 1]; });
  std::vector<int> world;
  int position = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    world.push_back(world_ranks[members[i]]);
    if (members[i] == parent.rank()) position = static_cast<int>(i);
  }
  return {world, position};
}

}  // namespace tandem::detail

// libtandem_cuda's entry points, found by libtandem.so with dlsym (collectives/cuda_library.cpp).
extern "C" int tandem_cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: clear the sticky error, report none
    return 0;
  }
  return n;
}

extern "C" void tandem_cuda_connect_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, const tandem::NcclOptions& options,
                                         std::shared_ptr<tandem::Communicator>& out) {
  using namespace tandem;
  using detail::check_cuda;
  using detail::check_nccl;
  if (size < 1 || rank < 0 || rank >= size) {
    throw ConfigError("tandem: connect_nccl: rank " + std::to_string(rank) +
                      " is not in [0, world size " + std::to_string(size) + ").");
  }
  if (options.timeout.count() <= 0) {
    throw ConfigError("tandem: connect_nccl: the op timeout is " +
                      std::to_string(options.timeout.count()) +
                      " ms; it must be > 0 (--set comm.timeout_s=<seconds>).");
  }
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (options.device < 0 || options.device >= devices) {
    throw ConfigError("tandem: connect_nccl: CUDA device " + std::to_string(options.device) +
                      " does not exist (this machine has " + std::to_string(devices) +
                      "); use LOCAL_RANK % device count.");
  }
  check_cuda(cudaSetDevice(options.device), "cudaSetDevice");
  const std::string key = options.store_prefix + "/nccl/unique_id";
  ncclUniqueId id;
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store->set(key, std::vector<uint8_t>(bytes, bytes + sizeof id));
  } else {
    const auto wait = options.rendezvous_timeout();
    try {
      store->wait({key}, wait);
    } catch (const std::exception& e) {
      throw TimeoutError("tandem: rank " + std::to_string(rank) +
                         " did not receive NCCL's unique id from rank 0 within " +
                         std::to_string(wait.count()) + " ms: " + e.what());
    }
    const auto bytes = store->get(key);
    if (bytes.size() != sizeof id) throw CommError("tandem: malformed NCCL unique id in store");
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  std::vector<int> world(size);
  for (int i = 0; i < size; ++i) world[i] = i;
  out = detail::make_nccl_communicator(comm, rank, std::move(world), options);
}
