// GlooCommunicator's send/recv: posted at once on the caller's thread (Gloo's unbound buffers),
// completed by waiting on the Work. A CUDA tensor travels through a pinned host buffer
// (gloo_host_staging.h): a send posts it once the copy in finished, a receive copies it back
// when waited.
#include "collectives/gloo/gloo_communicator.h"

#include "collectives/gloo/gloo_host_staging.h"

#include "collectives/tensor_checks.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/flight_recorder.h>

#include <xxhash.h>

#include <algorithm>

namespace tandem::detail {

namespace {

// Slot prefix of tandem's point-to-point transfers; Gloo's collectives use 0x01..0x08.
constexpr uint64_t kP2PSlotPrefix = 0x20;

// The slot of a transfer: the prefix, the tag and 24 bits of a hash of the byte count. A send and
// a receive of different sizes then never match (each times out naming its size) instead of
// meeting inside Gloo, which fills a larger receive silently and aborts the process on a smaller
// one (issue 20 item 9).
uint64_t p2p_slot(uint32_t tag, uint64_t nbytes) {
  return (kP2PSlotPrefix << 56) | (static_cast<uint64_t>(tag) << 24) |
         (XXH3_64bits(&nbytes, sizeof nbytes) & 0xFFFFFF);
}

class GlooP2PWork : public Work {
 public:
  GlooP2PWork(std::shared_ptr<GlooP2PState> state, OpDescription description,
              std::weak_ptr<GlooCommunicator> comm, std::chrono::milliseconds default_timeout)
      : state_(std::move(state)),
        description_(std::move(description)),
        comm_(std::move(comm)),
        default_timeout_(default_timeout),
        flight_id_(description_.flight_id) {
    FlightRecorder::instance().started(flight_id_);  // posted at once
  }

  void wait(std::chrono::milliseconds timeout) override {
    if (state_->waited) {
      if (state_->error) std::rethrow_exception(state_->error);
      if (state_->host) state_->host->wait_on_current_stream();  // this caller's stream too
      return;
    }
    if (timeout == kDefaultTimeout) timeout = default_timeout_;
    try {
      if (state_->buffer) {
        const bool ok = state_->is_send ? state_->buffer->wait_send(timeout)
                                        : state_->buffer->wait_recv(timeout);
        if (!ok) throw CommError("the communicator was aborted");
      }
      if (!state_->is_send) {
        if (state_->host) {
          state_->host->copy_back();
        } else {
          copy_back(state_->target, state_->staging);
        }
      }
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const bool timed_out = detail::is_timeout(e);
      const std::string msg =
          "tandem: " + description_.str() + (timed_out ? " timed out" : " failed") + " after " +
          format_elapsed(issued_at_) + ": " + what +
          (timed_out ? ". The peer is hung or never posted the matching op: the same tag and the "
                       "same size (post the same size on both ranks)."
                     : ". The peer died, or gave up on its side of this op (a timeout there: "
                       "it was hung, or posted another tag or size; post the same size on both "
                       "ranks); see its log.") +
          " The communicator is now unusable." + dump_flight_recorder(timed_out ? "timeout" : "failure");
      FlightRecorder::instance().ended(flight_id_, msg);
      state_->error = detail::op_error(e, timed_out, msg);
      state_->waited = true;
      if (auto comm = comm_.lock()) comm->mark_broken(msg, !timed_out && detail::peer_lost(e));
      std::rethrow_exception(state_->error);
    }
    state_->waited = true;
    if (state_->host) state_->host->wait_on_current_stream();
    FlightRecorder::instance().ended(flight_id_);
  }

  bool is_completed() override { return state_->waited; }
  std::string describe() const override { return description_.str(); }

 private:
  std::shared_ptr<GlooP2PState> state_;
  OpDescription description_;
  std::weak_ptr<GlooCommunicator> comm_;
  std::chrono::milliseconds default_timeout_;
  AsyncWork::Clock::time_point issued_at_ = AsyncWork::Clock::now();
  uint64_t flight_id_;
};

}  // namespace

WorkPtr GlooCommunicator::do_send(const at::Tensor& tensor, int dst, uint32_t tag) {
  return post_p2p(tensor, dst, tag, /*is_send=*/true);
}

WorkPtr GlooCommunicator::do_recv(const at::Tensor& tensor, int src, uint32_t tag) {
  return post_p2p(tensor, src, tag, /*is_send=*/false);
}

WorkPtr GlooCommunicator::post_p2p(const at::Tensor& tensor, int peer, uint32_t tag,
                                   bool is_send) {
  const char* op = is_send ? "send" : "recv";
  check_gloo_tensor(tensor, op, "tensor");
  if (peer == rank_) {
    throw CommError(std::string("tandem: ") + op + " to/from this rank (" +
                    std::to_string(rank_) + ") is not supported; copy the tensor locally.");
  }
  auto host = HostStaging::begin(op, {{tensor, "tensor", is_send ? HostStaging::Use::kRead
                                                                 : HostStaging::Use::kWrite}});
  auto d = describe(op,
                    tensor_summary(tensor) + staged_from(tensor) + (is_send ? ", to " : ", from ") +
                        std::to_string(peer) + ", tag " + std::to_string(tag),
                    /*p2p=*/true);
  throw_if_broken(d);
  auto state = std::make_shared<GlooP2PState>();
  state->is_send = is_send;
  state->target = tensor;
  if (host) {
    // The transport reads a send's buffer as soon as it is posted: the host waits for the copy in.
    if (is_send) host->wait_for_reads();
    state->staging = host->host(0);
    state->host = std::move(host);
  } else {
    state->staging = is_send ? contiguous_view(tensor)
                             : (tensor.is_contiguous() ? tensor : tensor.new_empty(tensor.sizes()));
  }
  const size_t nbytes = state->staging.numel() * state->staging.element_size();
  {
    // Posting under the lock makes the posting order the issue order.
    std::lock_guard<std::mutex> lock(mutex_);
    if (nbytes > 0) {
      state->buffer = mesh_->buffer(state->staging.data_ptr(), nbytes);
      const uint64_t slot = p2p_slot(tag, nbytes);
      if (is_send) {
        state->buffer->send(peer, slot, 0, nbytes);
      } else {
        state->buffer->recv(peer, slot, 0, nbytes);
      }
    }
    p2p_in_flight_.erase(std::remove_if(p2p_in_flight_.begin(), p2p_in_flight_.end(),
                                        [](const auto& s) { return s->waited.load(); }),
                         p2p_in_flight_.end());
    p2p_in_flight_.push_back(state);
  }
  return std::make_shared<GlooP2PWork>(std::move(state), std::move(d), weak_from_this(),
                                       options_.timeout);
}

}  // namespace tandem::detail
