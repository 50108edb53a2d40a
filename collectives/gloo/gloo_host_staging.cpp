// HostStaging (gloo_host_staging.h): CUDA tensors of a Gloo op through pinned host memory.
#include "collectives/gloo/gloo_host_staging.h"

#include "collectives/tensor_checks.h"

#include <tandem/base/errors.h>

#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <string>

namespace tandem::detail {

namespace {

// The Work of a staged collective: the host op's Work, then the caller's stream waits for the
// copies back.
class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr inner, std::shared_ptr<HostStaging> staging)
      : inner_(std::move(inner)), staging_(std::move(staging)) {}

  void wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    staging_->wait_on_current_stream();
  }
  // The host op finished and so did the copies back (read only after the op finished: the op
  // thread records them before it completes the inner Work).
  bool is_completed() override { return inner_->is_completed() && staging_->copied_back(); }
  std::string describe() const override { return inner_->describe(); }
  std::optional<std::chrono::steady_clock::time_point> completed_at() override {
    return inner_->completed_at();
  }

 private:
  WorkPtr inner_;
  std::shared_ptr<HostStaging> staging_;
};

}  // namespace

void check_gloo_tensor(const at::Tensor& t, const char* op, const char* arg) {
  if (!t.defined() || t.is_cpu()) return check_tensor(t, op, arg, c10::DeviceType::CPU, "gloo");
  const std::string where = std::string("tandem: ") + op + ": argument '" + arg + "' is on " +
                            t.device().str();
  if (!t.is_cuda()) {
    throw CommError(where +
                    " but the gloo communicator works on CPU tensors and on CUDA tensors (staged "
                    "through pinned host memory); move it with .to(torch::kCPU).");
  }
  check_tensor(t, op, arg, c10::DeviceType::CUDA, "gloo");
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
    throw CommError(where +
                    ", but libtorch's CUDA part (libtorch_cuda) is not loaded in this process, so "
                    "the gloo communicator cannot stage it through host memory; link the program "
                    "against torch (not torch_cpu alone), or pass a CPU tensor.");
  }
}

std::string staged_from(const at::Tensor& t) {
  return t.is_cuda() ? ", CUDA, host-staged" : "";
}

WorkPtr staged_work(WorkPtr inner, std::shared_ptr<HostStaging> staging) {
  if (!staging) return inner;
  return std::make_shared<StagedWork>(std::move(inner), std::move(staging));
}

std::shared_ptr<HostStaging> HostStaging::begin(const char* op, std::vector<Argument> arguments) {
  const Argument* cuda = nullptr;
  for (const auto& a : arguments) {
    if (a.tensor.is_cuda()) {
      cuda = &a;
      break;
    }
  }
  if (cuda == nullptr) return nullptr;
  for (const auto& a : arguments) {
    if (a.tensor.device() != cuda->tensor.device()) {
      throw CommError(std::string("tandem: ") + op + ": argument '" + cuda->name + "' is on " +
                      cuda->tensor.device().str() + " and '" + a.name + "' on " +
                      a.tensor.device().str() + "; put both on one device.");
    }
  }
  const std::string device = cuda->tensor.device().str();
  try {
    return std::shared_ptr<HostStaging>(new HostStaging(std::move(arguments)));
  } catch (const c10::Error& e) {
    throw CommError(std::string("tandem: ") + op + ": staging tensors on " + device +
                    " through pinned host memory for the gloo communicator failed: " +
                    e.what_without_backtrace() +
                    ". Check that libtorch sees this GPU (torch::cuda::is_available()), or pass "
                    "CPU tensors.");
  }
}

HostStaging::HostStaging(std::vector<Argument> arguments)
    : arguments_(std::move(arguments)),
      device_(arguments_.front().tensor.device()),
      guard_(c10::DeviceType::CUDA),
      stream_(guard_.getStreamFromGlobalPool(device_)),
      copied_(c10::DeviceType::CUDA),
      done_(c10::DeviceType::CUDA) {
  // X starts after everything the caller has queued on its current stream: the producer.
  c10::Event produced(c10::DeviceType::CUDA);
  produced.record(guard_.getStream(device_));
  produced.block(stream_);
  // Raw copies: autograd must not record them (a parameter that requires grad is a valid input).
  c10::AutoGradMode no_grad(false);
  c10::StreamGuard on_x(stream_);
  host_.reserve(arguments_.size());
  for (const auto& a : arguments_) {
    at::Tensor host =
        at::empty(a.tensor.sizes(), a.tensor.options().device(at::kCPU).pinned_memory(true));
    if (a.use != Use::kWrite) host.copy_(a.tensor, /*non_blocking=*/true);
    guard_.recordDataPtrOnStream(a.tensor.storage().data_ptr(), stream_);
    host_.push_back(std::move(host));
  }
  copied_.record(stream_);
}

void HostStaging::wait_for_reads() { copied_.synchronize(); }

void HostStaging::copy_back() {
  c10::AutoGradMode no_grad(false);
  c10::StreamGuard on_x(stream_);
  for (size_t i = 0; i < arguments_.size(); ++i) {
    if (arguments_[i].use != Use::kRead) arguments_[i].tensor.copy_(host_[i], /*non_blocking=*/true);
  }
  done_.record(stream_);
}

void HostStaging::wait_on_current_stream() { done_.block(guard_.getStream(device_)); }

}  // namespace tandem::detail
