// Internal: a Gloo op's CUDA tensors staged through pinned host memory, as PyTorch's
// ProcessGroupGloo does: Gloo runs on the host, so it carries host copies of the tensors, and
// several ranks can share one GPU.
//
// For an op issued on the caller's thread whose current stream of the device is S:
//   issue      (constructor, caller's thread) a side stream X of the device waits for S by an event,
//              so X runs after everything the caller queued so far (the producer); X copies every
//              tensor the op reads into a pinned host buffer (non_blocking) and records `copied`;
//   op thread  wait_for_reads() blocks the host until `copied` (Gloo reads the host buffers); the
//              collective runs on the host buffers; copy_back() queues the copies of every tensor
//              the op writes from its host buffer on X (non_blocking) and records `done`;
//   wait()     wait_on_current_stream(): after the host op completed, the caller's current stream
//              of the device waits for `done` by an event. The host never waits for the copy back.
// Lifetime: the staging holds the device tensors and their host buffers until it is destroyed
// (the Work and the queued op hold it). Each device tensor is also recorded on X
// (recordDataPtrOnStream), so the caching allocator keeps its memory until the work X had queued
// when the last reference went has finished: a caller may drop a tensor right after the call.
// libtorch's pinned allocator reuses a host buffer only after the non_blocking copies queued on it.
// Only c10's device-agnostic interfaces are used (VirtualGuardImpl, c10::Stream, c10::Event,
// StreamGuard): they reach CUDA through the guard libtorch_cuda registers at run time, so
// libtandem links no CUDA library.
// Thread-safety: one thread at a time, in the order above (the op queue orders the op thread's
// steps after the constructor, and the Work's wait after the op).
// Errors: begin() throws CommError naming the op and the arguments for tensors of one op on
// different devices, and for CUDA tensors libtorch cannot serve here (no CUDA part loaded, no
// device, no driver); the op-thread steps throw what libtorch throws (the op then fails).
#pragma once

#include <tandem/collectives/communicator.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <memory>
#include <string>
#include <vector>

namespace tandem::detail {

// A Gloo op's tensor argument: CPU, or CUDA (staged). Throws CommError as check_tensor() does,
// and for a device other than CPU and CUDA, or a CUDA tensor without libtorch's CUDA part.
void check_gloo_tensor(const at::Tensor& t, const char* op, const char* arg);
// ", CUDA, host-staged" for a CUDA tensor, "" otherwise: for op descriptions. The device type
// only: the flight recorder compares descriptions across ranks, which may use different GPUs.
std::string staged_from(const at::Tensor& t);

class HostStaging;
// The Work of a staged op: `inner` (the host op's), then wait() makes the caller's current stream
// wait for the copies back. `inner` itself when `staging` is null.
WorkPtr staged_work(WorkPtr inner, std::shared_ptr<HostStaging> staging);

class HostStaging {
 public:
  enum class Use { kRead, kWrite, kReadWrite };
  struct Argument {
    at::Tensor tensor;
    const char* name;  // for messages: "tensor", "output", "input"
    Use use;
  };

  // Null when no argument is on CUDA (a CPU op: nothing to stage). Otherwise every argument must
  // be on the same CUDA device; queues the copies in as described above.
  static std::shared_ptr<HostStaging> begin(const char* op, std::vector<Argument> arguments);

  // The pinned host buffer of argument `i`: contiguous, with its sizes and dtype. Written by the
  // device only for kRead/kReadWrite arguments, before wait_for_reads() returns.
  const at::Tensor& host(size_t i) const { return host_.at(i); }

  // Op thread: blocks until the host buffers hold the device tensors' data.
  void wait_for_reads();
  // Op thread, after the collective: queues the copies of the written arguments back to the
  // device on the side stream.
  void copy_back();
  // The calling thread's current stream of the device waits for the copies back.
  void wait_on_current_stream();
  // Whether the copies back have finished (true when none were queued).
  bool copied_back() const { return done_.query(); }

  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

 private:
  explicit HostStaging(std::vector<Argument> arguments);

  std::vector<Argument> arguments_;
  c10::Device device_;
  c10::impl::VirtualGuardImpl guard_;
  c10::Stream stream_;  // the side stream X
  std::vector<at::Tensor> host_;
  c10::Event copied_;
  c10::Event done_;
};

}  // namespace tandem::detail
