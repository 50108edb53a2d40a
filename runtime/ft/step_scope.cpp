#include <tandem/runtime/step_scope.h>

#include <algorithm>

namespace tandem::detail {
namespace {
thread_local StepScope* t_current = nullptr;
}  // namespace

StepScope::StepScope() : outer_(t_current) { t_current = this; }

StepScope::~StepScope() { t_current = outer_; }

StepScope* StepScope::current() { return t_current; }

bool StepScope::join(StepParticipant* participant) {
  if (std::find(participants_.begin(), participants_.end(), participant) != participants_.end())
    return false;
  participants_.push_back(participant);
  return true;
}

void StepScope::drop() {
  for (auto it = participants_.rbegin(); it != participants_.rend(); ++it) (*it)->drop_step();
}

}  // namespace tandem::detail
