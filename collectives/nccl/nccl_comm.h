// Internal (libtandem_cuda): what nccl_connect.cpp and nccl_communicator.cpp share. The NCCL
// communicator over an initialised ncclComm_t (it takes ownership of `comm`: destroyed, or
// aborted, with it); and the members of a split(): every rank's colour and key, all-gathered by
// an op of `parent` waited for on the host within its timeout, give the world ranks of this
// rank's colour ordered as ncclCommSplit orders them (key, then rank) and this rank's position
// among them (-1 without a colour). Errors: those of `parent`'s ops.
#pragma once

#include <tandem/collectives/communicator.h>
#include <tandem/collectives/nccl_communicator.h>

#include <nccl.h>

#include <memory>
#include <utility>
#include <vector>

namespace tandem::detail {

std::shared_ptr<Communicator> make_nccl_communicator(ncclComm_t comm, int rank,
                                                     std::vector<int> world_ranks,
                                                     const NcclOptions& options);

std::pair<std::vector<int>, int> split_members(Communicator& parent, int device, int color,
                                               int key, const std::vector<int>& world_ranks);

}  // namespace tandem::detail
