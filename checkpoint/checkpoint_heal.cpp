// CheckpointManager::heal (include/tandem/checkpoint/checkpoint_manager.h): the registered state
// of a live peer, streamed over the manager's communicator in the shard file's format instead of
// read from a checkpoint. Per state: the header's length and bytes, then each tensor's bytes and
// its XXH3-64, all point to point from each source to its receivers, one after the other.
#include "checkpoint/checkpoint_manager_impl.h"

#include <tandem/base/errors.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cstring>
#include <string_view>

namespace tandem {

namespace {

// One tag for the whole stream: point-to-point messages of one tag match in posting order.
constexpr uint32_t kHealTag = 0x4845414c;  // "HEAL"

std::string heal_error(const std::string& what) { return "tandem: checkpoint: heal: " + what; }

// A tensor's bytes as a flat uint8 tensor sharing its storage (contiguous CPU `t`).
at::Tensor bytes_of(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

void send_u64(Communicator& comm, uint64_t v, int dst) {
  at::Tensor t = at::empty({1}, at::kLong);
  std::memcpy(t.data_ptr(), &v, sizeof v);
  comm.send(t, dst, kHealTag)->wait();
}

uint64_t recv_u64(Communicator& comm, int src) {
  at::Tensor t = at::empty({1}, at::kLong);
  comm.recv(t, src, kHealTag)->wait();
  uint64_t v = 0;
  std::memcpy(&v, t.data_ptr(), sizeof v);
  return v;
}

}  // namespace

void CheckpointManager::heal(int source, const std::vector<int>& receivers) {
  heal(std::vector<int>(receivers.size(), source), receivers);
}

void CheckpointManager::heal(const std::vector<int>& sources, const std::vector<int>& receivers) {
  Impl& m = *impl_;
  auto bad_rank = [&](int r) { return r < 0 || r >= m.world; };
  auto receives = [&](int r) { return std::find(receivers.begin(), receivers.end(), r) != receivers.end(); };
  bool bad = sources.size() != receivers.size() ||
             std::any_of(receivers.begin(), receivers.end(), bad_rank) ||
             std::any_of(sources.begin(), sources.end(), [&](int s) { return bad_rank(s) || receives(s); });
  for (int r : receivers) bad = bad || std::count(receivers.begin(), receivers.end(), r) > 1;
  if (bad) {
    throw CheckpointError(heal_error("one source per receiver, every one a rank of the manager's " +
                                     std::to_string(m.world) + "-rank communicator, no receiver "
                                     "twice and no source among the receivers (" +
                                     std::to_string(sources.size()) + " sources, " +
                                     std::to_string(receivers.size()) + " receivers)."));
  }
  // This rank sends to `targets`, or receives from `source`, or takes no part.
  std::vector<int> targets;
  int source = -1;
  for (std::size_t i = 0; i < receivers.size(); ++i) {
    if (sources[i] == m.rank) targets.push_back(receivers[i]);
    if (receivers[i] == m.rank) source = sources[i];
  }
  const bool sending = !targets.empty();
  if (!sending && source < 0) return;
  m.wait_idle();
  m.rethrow_error();
  Communicator& comm = *m.comm;
  for (const detail::Entry& e : m.all_entries()) {
    const std::string prefix = e.name + "/";
    if (sending) {
      // A sliced state sends every piece this rank holds, also those its checkpoint leaves out.
      StateDict d = e.sharding == Sharding::kSliced
                        ? static_cast<SlicedCheckpointable&>(*e.state).own_state()
                        : e.state->state_dict();
      ShardHeader header;
      header.rank = m.rank;
      header.world_size = m.world;
      for (const auto& [key, t] : d.tensors) {
        TensorRecord r;
        r.name = prefix + key;
        r.dtype = to_checkpoint_dtype(t.scalar_type());
        r.shape = t.sizes().vec();
        header.tensors.push_back(r);
      }
      for (const auto& [key, v] : d.values) header.values[prefix + key] = v;
      const std::string bytes = encode_shard_header(&header, /*assign_offsets=*/true);
      at::Tensor wire = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
      std::memcpy(wire.data_ptr(), bytes.data(), bytes.size());
      for (int dst : targets) {
        send_u64(comm, bytes.size(), dst);
        comm.send(wire, dst, kHealTag)->wait();
      }
      for (const auto& [key, t] : d.tensors) {
        // One host copy at a time: memory stays bounded by the largest tensor.
        const at::Tensor host = t.detach().to(at::kCPU).contiguous();
        if (host.nbytes() == 0) continue;
        const uint64_t hash = xxh3_64(host.data_ptr(), host.nbytes());
        for (int dst : targets) {
          comm.send(bytes_of(host), dst, kHealTag)->wait();
          send_u64(comm, hash, dst);
        }
      }
      continue;
    }
    const uint64_t length = recv_u64(comm, source);
    if (length < 8 || length > kMaxShardHeaderBytes) {
      throw CheckpointError(heal_error("rank " + std::to_string(source) + " announced a header of " +
                                       std::to_string(length) + " bytes for state '" + e.name +
                                       "'; the peers do not run the same program."));
    }
    at::Tensor wire = at::empty({static_cast<int64_t>(length)}, at::kByte);
    comm.recv(wire, source, kHealTag)->wait();
    const auto* p = static_cast<const unsigned char*>(wire.data_ptr());
    const uint64_t json_length = decode_shard_header_length(p, length);
    const ShardHeader header =
        parse_shard_header(std::string_view(reinterpret_cast<const char*>(p) + 8, json_length), 0);
    StateDict d;
    for (const TensorRecord& r : header.tensors) {
      if (r.name.rfind(prefix, 0) != 0) {
        throw CheckpointError(heal_error("rank " + std::to_string(source) + " sent tensor '" +
                                         r.name + "' for state '" + e.name +
                                         "': the peers registered different states."));
      }
      at::Tensor t = at::empty(r.shape, at::TensorOptions().dtype(to_scalar_type(r.dtype)));
      if (t.nbytes() > 0) {
        comm.recv(bytes_of(t), source, kHealTag)->wait();
        const uint64_t want = recv_u64(comm, source);
        if (xxh3_64(t.data_ptr(), t.nbytes()) != want) {
          throw CheckpointError(heal_error("tensor '" + r.name + "' from rank " +
                                           std::to_string(source) +
                                           " arrived with a wrong XXH3 checksum; nothing of it was "
                                           "loaded. Retry the heal, or restart from the checkpoint."));
        }
      }
      d.tensors.emplace_back(r.name.substr(prefix.size()), std::move(t));
    }
    for (const auto& [key, v] : header.values) {
      if (key.rfind(prefix, 0) == 0) d.values[key.substr(prefix.size())] = v;
    }
    if (const std::string why = e.state->check(d); !why.empty()) {
      throw CheckpointError(heal_error(
          "state '" + e.name + "' from rank " + std::to_string(source) + " does not fit here: " + why +
          (e.sharding == Sharding::kSliced ? ". A sliced state heals only from the rank at the same "
                                             "position in another replica group (hybrid sharding: "
                                             "FaultTolerantWorld::heal_sources)."
                                           : ".")));
    }
    e.state->load(d);
  }
}

}  // namespace tandem
