// GlooCommunicator: connection (rendezvous through the store, shared-memory all-reduce), the op
// queue every collective runs on, failure state, and sub-groups. The collectives are in
// gloo_collectives.cpp, send/recv in gloo_p2p.cpp.
#include "collectives/gloo/gloo_communicator.h"

#include "collectives/gloo/gloo_host_staging.h"
#include "collectives/gloo/gloo_library.h"
#include "collectives/gloo/gloo_store_adapter.h"
#include "collectives/shm/shm_collectives.h"
#include "collectives/tensor_checks.h"

#include <tandem/collectives/flight_recorder.h>
#include <tandem/base/errors.h>
#include <tandem/base/trace.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <system_error>
#include <thread>

namespace tandem {

namespace detail {

bool is_timeout(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e) != nullptr) return true;
  const auto* io = dynamic_cast<const std::system_error*>(&e);
  return io != nullptr && io->code() == std::errc::timed_out;
}

bool peer_lost(const std::exception& e) {
  if (dynamic_cast<const PeerLostError*>(&e) != nullptr) return true;
  const auto* io = dynamic_cast<const std::system_error*>(&e);
  return io != nullptr && io->code() == std::errc::connection_reset;
}

std::exception_ptr op_error(const std::exception& cause, bool timed_out, const std::string& message) {
  if (timed_out) return std::make_exception_ptr(TimeoutError(message));
  if (peer_lost(cause)) return std::make_exception_ptr(PeerLostError(message));
  return std::make_exception_ptr(CommError(message));
}

at::Tensor contiguous_view(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

void copy_back(const at::Tensor& target, const at::Tensor& buffer) {
  if (!buffer.is_same(target)) target.copy_(buffer.view(target.sizes()));
}

}  // namespace detail

std::shared_ptr<Communicator> connect_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw ConfigError("tandem: connect_gloo: rank " + std::to_string(rank) +
                      " is not in [0, world size " + std::to_string(size) +
                      "); check RANK and WORLD_SIZE.");
  }
  if (!store) throw ConfigError("tandem: connect_gloo: store is null");
  auto device = detail::open_gloo_device(options.interface, options.hostname);
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  return std::make_shared<detail::GlooCommunicator>(
      store, std::move(device), options.store_prefix + "/world", rank, std::move(ranks), options);
}

}  // namespace tandem

namespace tandem::detail {

GlooCommunicator::GlooCommunicator(c10::intrusive_ptr<c10d::Store> store,
                                   std::shared_ptr<GlooDevice> device, std::string prefix, int rank,
                                   std::vector<int> world_ranks, GlooOptions options)
    : store_(std::move(store)),
      device_(std::move(device)),
      prefix_(std::move(prefix)),
      rank_(rank),
      world_ranks_(std::move(world_ranks)),
      options_(std::move(options)) {
  GlooStoreAdapter adapter(c10::make_intrusive<c10d::PrefixStore>(prefix_, store_),
                           "rendezvous of " + std::to_string(size()) + " ranks under '" +
                               prefix_ + "' (this is world rank " +
                               std::to_string(world_ranks_[rank_]) + ")",
                           size());
  try {
    mesh_ = device_->connect(adapter, rank_, size(), options_.rendezvous_timeout());
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError("tandem: connecting " + std::to_string(size()) + " ranks under '" + prefix_ +
                    "' failed: " + e.what() +
                    ". Check that the ranks can reach each other (GlooOptions::hostname).");
  }
  // Collective like the rendezvous above: every rank reaches the same answer.
  ShmChannelOptions shm;
  shm.enabled = options_.shared_memory;
  shm.slot_bytes = options_.shared_memory_slot_bytes;
  shm.peer_reads = options_.shared_memory_peer_reads;
  shm.timeout = options_.timeout;
  shm.rendezvous_timeout = options_.rendezvous_timeout();
  shm.disable_hint = "GlooOptions::shared_memory = false (--set comm.shared_memory=false)";
  if (auto channel = connect_shm_channel(store_, prefix_, rank_, world_ranks_, shm)) {
    shm_ = std::make_unique<ShmCollectives>(std::move(channel));
  }
}

GlooCommunicator::~GlooCommunicator() {
  try {
    ops_.drain();  // every queued op runs (and completes its Work) before the context goes
  } catch (...) {
    // Ops report through their Work; nothing escapes run_op.
  }
  // Unwaited sends/recvs may still be referenced by the transport: close connections first.
  const bool pending = std::any_of(p2p_in_flight_.begin(), p2p_in_flight_.end(),
                                   [](const auto& s) { return !s->waited; });
  if (pending) abort_self("communicator destroyed with send/recv ops that were never waited");
  p2p_in_flight_.clear();
}

void GlooCommunicator::mark_broken(const std::string& reason, bool peer_lost) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_reason_.empty()) return;
  broken_reason_ = reason;
  broken_by_lost_peer_ = peer_lost;
}

void GlooCommunicator::abort(const std::string& reason) {
  abort_self(reason);
  groups_.abort(reason);
}

void GlooCommunicator::abort_self(const std::string& reason) {
  mark_broken("aborted: " + reason);
  FlightRecorder::instance().dump("abort");
  if (shm_) shm_->abort();
  mesh_->close();
}

OpDescription GlooCommunicator::describe(const char* name, std::string detail, bool p2p) {
  // A collective's number is also its Gloo tag, which must agree across ranks.
  const Issued op = issue(name, detail, p2p);
  OpDescription d;
  d.name = name;
  d.seq = op.seq;
  d.detail = std::move(detail);
  d.ranks = ranks_text();
  d.p2p = p2p;
  d.flight_id = op.flight_id;
  return d;
}

void GlooCommunicator::throw_if_broken(const OpDescription& description) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_reason_.empty()) {
    const std::string msg = "tandem: " + description.str() +
                            " refused: the communicator is unusable after an earlier failure: " +
                            broken_reason_;
    FlightRecorder::instance().ended(description.flight_id, msg);  // it never ran
    if (broken_by_lost_peer_) throw PeerLostError(msg);
    throw CommError(msg);
  }
}

WorkPtr GlooCommunicator::enqueue(OpDescription description, std::function<void()> run) {
  throw_if_broken(description);
  std::weak_ptr<GlooCommunicator> weak = weak_from_this();
  OpDescription copy = description;  // for the timeout handler: `description` moves into the Work
  auto work = std::make_shared<AsyncWork>(std::move(description), options_.timeout,
                                          [weak, d = std::move(copy)](const std::string& msg) {
                                            auto self = weak.lock();
                                            if (!self) return std::string();
                                            self->mark_broken(msg);
                                            return self->who_never_joined(d);
                                          });
  ops_.submit([this, work, run = std::move(run)] { run_op(*work, run); });
  return work;
}

WorkPtr GlooCommunicator::enqueue_staged(OpDescription description,
                                         std::shared_ptr<HostStaging> staging,
                                         std::function<void()> run) {
  if (!staging) return enqueue(std::move(description), std::move(run));
  auto work = enqueue(std::move(description), [staging, run = std::move(run)] {
    staging->wait_for_reads();  // Gloo reads the host buffers
    run();
    staging->copy_back();
  });
  return staged_work(std::move(work), std::move(staging));
}

std::string GlooCommunicator::who_never_joined(const OpDescription& d) {
  // Every rank that times out in this collective says so in the store; after a grace period the
  // members that did not are the ones that never joined it (hung earlier, dead, or elsewhere).
  // Costs nothing until a timeout.
  const std::string base = prefix_ + "/timeouts/" + std::to_string(d.seq) + "/";
  try {
    store_->set(base + std::to_string(rank_), std::vector<uint8_t>{1});
    std::vector<int> absent;
    const auto deadline = std::chrono::steady_clock::now() + kJoinGrace;
    for (;;) {
      absent.clear();
      for (int r = 0; r < size(); ++r) {
        if (r != rank_ && !store_->check({base + std::to_string(r)})) absent.push_back(world_ranks_[r]);
      }
      if (absent.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (absent.empty()) return " Every rank of the group timed out in it too.";
    std::string ranks;
    for (int r : absent) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    return " Rank(s) " + ranks + " never joined it (within " + std::to_string(kJoinGrace.count() / 1000) +
           " s, they did not report timing out in it: hung in an earlier op, dead, or busy elsewhere).";
  } catch (const std::exception&) {
    return "";  // the store itself is gone: nothing more to learn
  }
}

void GlooCommunicator::run_op(AsyncWork& work, const std::function<void()>& run) {
  std::string broken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    broken = broken_reason_;
  }
  const OpDescription& d = work.description();
  std::exception_ptr error;
  if (!broken.empty()) {
    const std::string msg =
        "tandem: " + d.str() + " was not run: the communicator became unusable: " + broken;
    std::lock_guard<std::mutex> lock(mutex_);
    error = broken_by_lost_peer_ ? std::make_exception_ptr(PeerLostError(msg))
                                 : std::make_exception_ptr(CommError(msg));
  } else {
    try {
      FlightRecorder::instance().started(work.flight_id());
      trace::Span span(d.name.c_str(), trace::kComm);  // the op on the wire, on this thread
      if (trace::enabled()) span.arg("op", d.str());
      run();
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const bool timed_out = detail::is_timeout(e);
      const bool lost = !timed_out && detail::peer_lost(e);
      // The op's own timeout can fire before the waiter's: name the absent ranks here too, so
      // the message does not depend on which of the two came first.
      const std::string msg =
          "tandem: " + d.str() + (timed_out ? " timed out" : " failed") + " after " +
          format_elapsed(work.issued_at()) + ": " + what +
          (timed_out ? ". A peer rank is hung or did not issue this op (ranks must issue "
                       "collectives in the same order)."
                     : lost ? ". A peer rank is gone; see its log for why."
                            : ".") +
          " The communicator is now unusable." + (timed_out ? who_never_joined(d) : "") +
          dump_flight_recorder(timed_out ? "timeout" : "failure");
      mark_broken(msg, lost);
      error = op_error(e, timed_out, msg);
    }
  }
  work.finish(error);
}

std::shared_ptr<GlooCommunicator> GlooCommunicator::make_group(const std::vector<int>& ranks,
                                                               const std::string& name) {
  std::vector<int> world;
  world.reserve(ranks.size());
  for (int r : ranks) world.push_back(world_ranks_[r]);
  const int group_rank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  return groups_.add(std::make_shared<GlooCommunicator>(store_, device_, prefix_ + "/" + name,
                                                        group_rank, std::move(world), options_));
}

std::shared_ptr<Communicator> GlooCommunicator::do_new_group(const std::vector<int>& ranks) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = next_group_++;
  }
  if (std::find(ranks.begin(), ranks.end(), rank_) == ranks.end()) return nullptr;
  // The member list is part of the key: ranks that disagree on it never meet and time out.
  return make_group(ranks, "group" + std::to_string(id) + format_ranks(ranks));
}

std::shared_ptr<Communicator> GlooCommunicator::split(int color, int key) {
  at::Tensor mine = at::empty({2}, at::kLong);
  mine.data_ptr<int64_t>()[0] = color;
  mine.data_ptr<int64_t>()[1] = key;
  at::Tensor all = at::empty({2 * size()}, at::kLong);
  allgather(all, mine)->wait();
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = next_group_++;
  }
  if (color < 0) return nullptr;
  const int64_t* v = all.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int>> members;  // (key, rank)
  for (int r = 0; r < size(); ++r) {
    if (v[2 * r] == color) members.emplace_back(v[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;  // group rank = position, i.e. ordered by (key, rank)
  for (const auto& m : members) ranks.push_back(m.second);
  return make_group(ranks, "split" + std::to_string(id) + "/color" + std::to_string(color));
}

}  // namespace tandem::detail
