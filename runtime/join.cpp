// Join (include/tandem/runtime/join.h): the flag all-reduce and the joined rank's shadow loop.
#include <tandem/runtime/join.h>

#include <ATen/ops/zeros.h>

#include <cstdio>
#include <exception>

namespace tandem {

namespace {

// Sums every rank's {has data, synchronises} flag.
std::pair<int64_t, int64_t> all_reduce_flag(Communicator& comm, bool active, bool sync) {
  at::Tensor flag = at::zeros({2}, at::kLong);
  flag.data_ptr<int64_t>()[0] = active ? 1 : 0;
  flag.data_ptr<int64_t>()[1] = active && sync ? 1 : 0;
  comm.allreduce(flag, ReduceOp::kSum)->wait();
  return {flag.data_ptr<int64_t>()[0], flag.data_ptr<int64_t>()[1]};
}

}  // namespace

void detail::notify_join(Communicator& comm, bool sync) { all_reduce_flag(comm, true, sync); }

Join::Join(detail::Joinable& joinable, std::function<void()> after_backward)
    : joinable_(joinable),
      after_backward_(std::move(after_backward)),
      uncaught_(std::uncaught_exceptions()) {
  joinable_.set_join_active(true);
}

Join::~Join() {
  if (finished_) return;
  if (std::uncaught_exceptions() > uncaught_) {
    joinable_.set_join_active(false);  // unwinding: the peers' collectives time out and say so
    return;
  }
  try {
    finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: Join: finishing at destruction failed: %s\n", e.what());
  }
}

void Join::finish() {
  if (finished_) return;
  finished_ = true;
  joinable_.set_join_active(false);
  Communicator& comm = joinable_.join_communicator();
  for (;;) {
    const auto [active, sync] = all_reduce_flag(comm, false, false);
    if (active == 0) return;  // every rank has finished
    joinable_.shadow_step(sync > 0);
    if (sync > 0 && after_backward_) after_backward_();
    ++shadowed_;
  }
}

}  // namespace tandem
