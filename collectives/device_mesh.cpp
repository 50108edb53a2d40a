// DeviceMesh (include/tandem/collectives/device_mesh.h).
#include <tandem/collectives/device_mesh.h>

#include <tandem/base/errors.h>

#include <set>

namespace tandem {
namespace {

std::string sizes_text(const std::vector<MeshDim>& dims) {
  std::string out;
  for (const MeshDim& d : dims) out += (out.empty() ? "" : " x ") + d.name + "=" + std::to_string(d.size);
  return out.empty() ? "(no dimensions)" : out;
}

// Row-major coordinates of world rank `rank`.
std::vector<int> coordinates_of(int rank, const std::vector<MeshDim>& dims) {
  std::vector<int> c(dims.size());
  for (size_t i = dims.size(); i-- > 0;) {
    c[i] = rank % dims[i].size;
    rank /= dims[i].size;
  }
  return c;
}

// The row-major index of `c` over the dimensions where `chosen[i] == want`.
int linear_index(const std::vector<int>& c, const std::vector<MeshDim>& dims,
                 const std::vector<bool>& chosen, bool want) {
  int index = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (chosen[i] == want) index = index * dims[i].size + c[i];
  }
  return index;
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<Communicator> world, std::vector<MeshDim> dims)
    : world_(std::move(world)), dims_(std::move(dims)) {
  if (!world_) throw ConfigError("tandem: DeviceMesh: the world communicator is null.");
  std::set<std::string> seen;
  long long ranks = 1;
  for (const MeshDim& d : dims_) {
    if (d.name.empty()) throw ConfigError("tandem: DeviceMesh " + sizes_text(dims_) + ": a dimension has no name.");
    if (!seen.insert(d.name).second) {
      throw ConfigError("tandem: DeviceMesh " + sizes_text(dims_) + ": dimension '" + d.name +
                        "' appears twice; name each dimension once.");
    }
    if (d.size < 1) {
      throw ConfigError("tandem: DeviceMesh " + sizes_text(dims_) + ": dimension '" + d.name +
                        "' has size " + std::to_string(d.size) + "; every size is at least 1.");
    }
    ranks *= d.size;
  }
  if (ranks != world_->size()) {
    throw ConfigError("tandem: DeviceMesh " + sizes_text(dims_) + " holds " + std::to_string(ranks) +
                      " ranks, but the world has " + std::to_string(world_->size()) +
                      "; choose sizes whose product is the world size.");
  }
  coordinates_ = coordinates_of(world_->rank(), dims_);
}

size_t DeviceMesh::index(const std::string& dim) const {
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].name == dim) return i;
  }
  std::string names;
  for (const MeshDim& d : dims_) names += (names.empty() ? "" : ", ") + d.name;
  throw ConfigError("tandem: DeviceMesh " + sizes_text(dims_) + " has no dimension '" + dim +
                    "'; its dimensions are: " + (names.empty() ? "none" : names) + ".");
}

std::string DeviceMesh::describe() const {
  std::string here;
  for (size_t i = 0; i < dims_.size(); ++i)
    here += (i == 0 ? "" : ", ") + dims_[i].name + " " + std::to_string(coordinates_[i]);
  return sizes_text(dims_) + " (this rank: " + (here.empty() ? "alone" : here) + ")";
}

std::vector<int> DeviceMesh::group_ranks(const std::vector<std::string>& dims) const {
  std::vector<bool> chosen(dims_.size(), false);
  for (const std::string& d : dims) chosen[index(d)] = true;
  const int mine = linear_index(coordinates_, dims_, chosen, false);
  std::vector<int> ranks;  // increasing world rank is row-major order over the chosen dimensions
  for (int r = 0; r < world_->size(); ++r) {
    if (linear_index(coordinates_of(r, dims_), dims_, chosen, false) == mine) ranks.push_back(r);
  }
  return ranks;
}

std::shared_ptr<Communicator> DeviceMesh::group(const std::vector<std::string>& dims,
                                                const std::string& lane) {
  std::vector<bool> chosen(dims_.size(), false);
  for (const std::string& d : dims) {
    const size_t i = index(d);
    if (chosen[i]) {
      throw ConfigError("tandem: DeviceMesh::group: dimension '" + d + "' is named twice.");
    }
    chosen[i] = true;
  }
  std::vector<size_t> key;
  bool everyone = true;  // every dimension of more than one rank chosen: the group is the world
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (chosen[i]) key.push_back(i);
    else if (dims_[i].size > 1) everyone = false;
  }
  if (everyone && lane.empty()) return world_;
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = groups_[{key, lane}];
  if (!slot) {
    // Equal coordinates outside `dims` (the color) make one group, ordered by those inside.
    slot = world_->split(linear_index(coordinates_, dims_, chosen, false),
                         linear_index(coordinates_, dims_, chosen, true));
  }
  return slot;
}

std::shared_ptr<DeviceMesh> DeviceMesh::rebuilt(std::shared_ptr<Communicator> world) const {
  if (!world) throw ConfigError("tandem: DeviceMesh::rebuilt: the world communicator is null.");
  std::vector<MeshDim> dims = dims_;
  if (dims.empty()) return std::make_shared<DeviceMesh>(std::move(world), std::move(dims));
  int inner = 1;
  for (size_t i = 1; i < dims.size(); ++i) inner *= dims[i].size;
  if (world->size() % inner != 0) {
    throw ConfigError("tandem: DeviceMesh " + sizes_text(dims_) + ": a new world of " +
                      std::to_string(world->size()) + " ranks cannot keep the inner dimensions (" +
                      std::to_string(inner) + " ranks each); only '" + dims[0].name +
                      "' may change size.");
  }
  dims[0].size = world->size() / inner;
  return std::make_shared<DeviceMesh>(std::move(world), std::move(dims));
}

}  // namespace tandem
