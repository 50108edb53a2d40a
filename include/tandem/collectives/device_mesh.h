// DeviceMesh: the ranks of a world laid out as a grid with named dimensions (for example
// {"pp", 2}, {"dp_replicate", 1}, {"dp_shard", 4}), and the one place that turns a choice of
// dimensions into a communicator. The pipeline's stage and data groups and ShardedDataParallel's
// shard and replicate groups come from here; tensor parallelism's `tp` is one more dimension.
//
// Layout: row-major, the last dimension varying fastest, as torch's DeviceMesh: world rank r has
// coordinate (r / stride(d)) % size(d) in dimension d, where stride(d) is the product of the sizes
// after d. group({d...}) connects the ranks that differ from this one only in the dimensions named.
//
// A group is made on the first call for its dimensions and lane, by world->split(): a collective
// over the whole world, so every rank asks for the same groups in the same order. Later calls
// return the same communicator, and a group of every rank on the default lane is the world itself:
// one communicator per set of ranks. A lane names an independent op order over the same ranks (""
// by default; ZeRO-3's "gather" and "reduce", the checkpoint manager's background ops): two lanes
// are two communicators, whose ops may run at once.
//
// Ownership: shares the world and every group it made. Thread-safety: group() may be called from
// several threads (it is serialised), but the world's collective order rules still apply.
// Errors: ConfigError for dimensions whose sizes do not multiply to the world's size, an empty
// or repeated name, a size below 1, and an unknown dimension (naming the ones there are).
#pragma once

#include <tandem/collectives/communicator.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

struct MeshDim {
  std::string name;
  int size = 1;
};

class DeviceMesh {
 public:
  DeviceMesh(std::shared_ptr<Communicator> world, std::vector<MeshDim> dims);

  const std::shared_ptr<Communicator>& world() const { return world_; }
  const std::vector<MeshDim>& dims() const { return dims_; }
  int size(const std::string& dim) const { return dims_[index(dim)].size; }
  // This rank's position along `dim`.
  int coordinate(const std::string& dim) const { return coordinates_[index(dim)]; }
  // The mesh as text: "pp=2 x dp_shard=4 (this rank: pp 1, dp_shard 3)".
  std::string describe() const;

  // The ranks that share this rank's coordinates in every dimension not named in `dims`, ordered
  // by their coordinates in `dims` (row-major). Never null: a group of one rank is a communicator
  // too. Collective over the world on the first call for (dims, lane); see the header comment.
  std::shared_ptr<Communicator> group(const std::vector<std::string>& dims,
                                      const std::string& lane = "");

  // World ranks of the group `dims` this rank belongs to, in group-rank order. Pure.
  std::vector<int> group_ranks(const std::vector<std::string>& dims) const;

  // The same layout over `world`, a new epoch's communicator (step-level fault tolerance): the
  // first dimension (the outermost, the replicas) takes the size the new world leaves it, the
  // others keep theirs. Groups are made afresh, on first use. ConfigError when the other sizes
  // do not divide the new world's size.
  std::shared_ptr<DeviceMesh> rebuilt(std::shared_ptr<Communicator> world) const;

 private:
  size_t index(const std::string& dim) const;

  std::shared_ptr<Communicator> world_;
  std::vector<MeshDim> dims_;
  std::vector<int> coordinates_;
  std::mutex mutex_;
  std::map<std::pair<std::vector<size_t>, std::string>, std::shared_ptr<Communicator>> groups_;
};

}  // namespace tandem
