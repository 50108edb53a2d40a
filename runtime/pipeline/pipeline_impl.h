// Private to runtime/pipeline: PipelineParallel's state, shared by pipeline_parallel.cpp
// (construction, the step), pipeline_actions.cpp (running one schedule action),
// pipeline_transport.cpp (the send thread, collective helpers) and pipeline_stats.cpp (recording,
// partitioning).
#pragma once

#include "base/serial_executor.h"

#include <ATen/core/grad_mode.h>
#include <tandem/base/errors.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/runtime/pipeline_parallel.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace tandem {

namespace detail {

using Clock = std::chrono::steady_clock;
constexpr int kMaxDims = 8;

double seconds_between(Clock::time_point a, Clock::time_point b);
at::Tensor longs(const std::vector<int64_t>& v);
// Collective helpers over `comm` (every rank calls them with the same sizes).
std::vector<int64_t> allgather_longs(Communicator& comm, const std::vector<int64_t>& mine);
std::vector<double> allreduce_doubles(Communicator& comm, const std::vector<double>& mine);
// 0 F, 1 B, 2 I, 3 W; -1 for comm actions.
int64_t op_index(pipeline::Op op);

// Posts sends on a thread of its own ("tandem-pp-send", a SerialExecutor), in the order they were
// queued, so the training thread never blocks inside the transport (Gloo's send can hold the
// caller for milliseconds while the pair's loop thread reads). A CUDA tensor's send is posted with
// the queuing thread's current stream current, so it waits for the kernels that produced it.
// Owned by PipelineParallel::Impl.
class SendThread {
 public:
  explicit SendThread(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  // Queues a send; rethrows the first error an earlier send raised.
  void send(at::Tensor tensor, int peer, uint32_t tag);
  // Waits until every queued send is posted and complete; rethrows the first error.
  void drain();

 private:
  std::shared_ptr<Communicator> comm_;
  std::mutex mu_;  // guards posted_ and error_
  std::vector<std::pair<WorkPtr, at::Tensor>> posted_;
  std::exception_ptr error_;
  SerialExecutor executor_{"tandem-pp-send"};  // last: joined first, while the above still lives
};

}  // namespace detail

using detail::Clock;

struct PipelineParallel::Impl {
  // train_step() waits for async checkpoint copies, so saves may defer them (checkpoint_manager.h).
  CheckpointStagingFence staging_fence;
  struct Layer {
    torch::nn::AnyModule module;
    std::vector<at::Tensor> params;  // requiring grad
    int global_index = 0;
    torch::nn::LinearImpl* linear = nullptr;  // W computed by hand: grad = g^T x, bias = sum g
  };
  struct Micro {
    at::Tensor input;                      // leaf requiring grad (stages > 0) or the raw microbatch
    at::Tensor root;                       // stage output, or the scaled loss on the last stage
    std::vector<at::Tensor> bounds;        // outputs of layers with parameters (I/W split)
    std::vector<int> bound_layers;         // local layer index of each bound
    std::vector<at::Tensor> bound_inputs;  // each bound's layer input (Linear: W by hand)
    std::vector<at::Tensor> bound_grads;
    int64_t bytes = 0;
  };
  struct Stage {
    int index = 0;
    torch::nn::Sequential module;
    std::vector<Layer> layers;
    std::map<int, Micro> live;
    int64_t held = 0, peak = 0;
    double sum[4] = {0, 0, 0, 0};
    int64_t count[4] = {0, 0, 0, 0};
    std::vector<double> layer_forward;  // seconds, summed
    bool all_linear = true;  // every layer with parameters is a plain Linear: B runs as I + W
  };

  std::shared_ptr<Communicator> comm, data;
  PipelineOptions options;
  pipeline::Schedule schedule;
  std::vector<int64_t> balance;
  int num_layers = 0;
  int S = 0, M = 0, rank = 0;
  bool split_backward = false;  // the schedule uses I/W
  std::map<int, Stage> stages;  // local, by global index

  // Per step.
  std::map<std::tuple<int, int, int>, at::Tensor> mailbox;  // (0 fwd / 1 bwd, stage, mb)
  std::map<std::pair<int, int>, std::pair<std::vector<int64_t>, int64_t>> shape_cache;  // RECV_F
  std::vector<int64_t> last_signature;
  bool send_meta = true;
  c10::Device device{c10::kCPU};  // where this step's activations live (step_device())
  std::vector<at::Tensor> micro_inputs, micro_targets;
  std::unique_ptr<detail::SendThread> sender;
  // Receives posted ahead of their RECV action (same tag, so matching is unchanged): the
  // transport completes them while this rank computes; the RECV action only waits.
  std::map<std::tuple<int, int, int>, std::pair<WorkPtr, at::Tensor>> posted;
  // Without message tags (Communicator::p2p_tags false: NCCL) a step runs `untagged`: it runs
  // `untagged_schedule` (lower_untagged()'s placement of the sends and receives), each run of
  // consecutive SEND/RECV actions one send_recv() batch, posted at its last action (batch_end),
  // nothing posted ahead; a received tensor's batch is waited for (a stream wait on NCCL) by the
  // action that uses it. When shapes are new, the run's ops go one by one instead, each
  // activation's shape (int64s on the device) right before it, read back on the host by its
  // receiver. Why that schedule cannot run ("" when it can) is kept from construction.
  bool untagged = false;
  pipeline::Schedule untagged_schedule;
  std::string untagged_error;
  std::vector<bool> batch_end;          // this rank's actions: the last of a run of SEND/RECV
  std::vector<pipeline::Action> batch;  // the run being collected
  std::map<std::tuple<int, int, int>, WorkPtr> arriving;  // mailbox entries of posted batches
  std::vector<std::pair<WorkPtr, std::vector<at::Tensor>>> in_flight;  // batches of this step
  at::Tensor step_loss;
  const LossFn* loss_fn = nullptr;
  Clock::time_point step_start;
  double step_start_abs = 0;  // step_start in seconds of the steady clock's epoch
  std::vector<pipeline::TimedAction> timeline;
  double last_busy = 0, last_span = 0;

  uint32_t tag(int kind, int stage, int mb, int meta) const {
    return static_cast<uint32_t>(1 +
                                 (((static_cast<int64_t>(kind) * S + stage) * M + mb) * 2 + meta));
  }
  int rank_of(int stage) const { return schedule.stage_to_rank[stage]; }

  void partition(torch::nn::Sequential& model);
  // Where this step's activations live: the local stages' parameters' device, else the input's
  // (or the target's) - ranks without stage 0 may pass no input.
  c10::Device step_device(const at::Tensor& input, const at::Tensor& target) const;
  void agree_at_construction(const std::string& local_error);
  void check_step(const at::Tensor& input, const at::Tensor& target);
  void run(const pipeline::Action& a);
  void forward(Stage& st, int k);
  void backward(Stage& st, int k, pipeline::Op op);
  void release(Stage& st, int k);
  void reduce_data_parallel();
  // The untagged path: adds comm action `a` to the batch, and posts the batch at its last action.
  void add_to_batch(const pipeline::Action& a, bool last);
  void post_batch();
  // Posts `actions` (comm actions) as one send_recv() batch, shapes first where they are new.
  void post_ops(const std::vector<pipeline::Action>& actions);
  // dtype, rank and sizes of `t`, stage `stage`'s output, as the shape messages carry them.
  static std::vector<int64_t> shape_message(const at::Tensor& t, int stage);
  int peer_of(const pipeline::Action& a) const {
    const bool forward = a.op == pipeline::Op::kSendForward || a.op == pipeline::Op::kRecvForward;
    const bool send = a.op == pipeline::Op::kSendForward || a.op == pipeline::Op::kSendBackward;
    if (!send) return rank_of(a.stage);
    return rank_of(forward ? a.stage + 1 : a.stage - 1);
  }
  // The mailbox's tensor for (kind, stage, k), removed: waited for when a batch brought it, and
  // on the step's device.
  at::Tensor take_mail(int kind, int stage, int k);
  void post_recv(int kind, int stage, int k, const at::Tensor& buffer) {
    const int peer = rank_of(stage);
    posted[{kind, stage, k}] = {comm->recv(buffer, peer, tag(kind, stage, k, 0)), buffer};
  }
  // The posted receive's tensor, after waiting for it; undefined when none was posted.
  at::Tensor take_posted(int kind, int stage, int k) {
    auto it = posted.find({kind, stage, k});
    if (it == posted.end()) return at::Tensor();
    it->second.first->wait();
    at::Tensor t = it->second.second;
    posted.erase(it);
    return t;
  }
};

}  // namespace tandem
