// Internal: the sub-groups a communicator made (new_group/split), so that aborting it aborts them
// too. They connect the same peers: an op blocked in one on a peer the parent gave up on would
// otherwise wait out its timeout (a sharded wrapper's gathers and reduces run on sub-groups).
// Holds them weakly: a sub-group lives as long as its users keep it. Thread-safe.
#pragma once

#include <tandem/collectives/communicator.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tandem::detail {

class SubGroups {
 public:
  template <class Group>
  std::shared_ptr<Group> add(std::shared_ptr<Group> group) {
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.erase(std::remove_if(groups_.begin(), groups_.end(), [](const auto& g) { return g.expired(); }),
                  groups_.end());
    groups_.push_back(group);
    return group;
  }
  // Aborts every sub-group still alive (and, through their own, theirs).
  void abort(const std::string& reason) {
    std::vector<std::weak_ptr<Communicator>> groups;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      groups.swap(groups_);
    }
    for (const auto& g : groups) {
      if (auto group = g.lock()) group->abort(reason);
    }
  }

 private:
  std::mutex mutex_;
  std::vector<std::weak_ptr<Communicator>> groups_;
};

}  // namespace tandem::detail
