// Device-to-host staging of checkpoint tensors (see checkpoint/device_staging.h).
#include "checkpoint/device_staging.h"

#include <tandem/base/errors.h>

#include <ATen/ops/empty.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

namespace tandem::detail {
namespace {

constexpr size_t kSlab = size_t{64} << 20;
constexpr size_t kAlign = 512;  // whole DMA-friendly pieces; every dtype's alignment

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

void PinnedArena::reset() {
  slab_ = 0;
  used_ = 0;
}

at::Tensor PinnedArena::take(size_t nbytes) {
  const size_t want = std::max(round_up(nbytes, kAlign), kAlign);
  while (slab_ < slabs_.size() && used_ + want > static_cast<size_t>(slabs_[slab_].numel())) {
    ++slab_;
    used_ = 0;
  }
  if (slab_ == slabs_.size()) {
    const size_t size = std::max(kSlab, want);
    try {
      slabs_.push_back(at::empty({static_cast<int64_t>(size)},
                                 at::TensorOptions().dtype(at::kByte).pinned_memory(true)));
    } catch (const c10::Error& e) {
      throw CheckpointError(
          "tandem: checkpoint: cannot allocate " + std::to_string(size) +
          " bytes of pinned host memory to stage device tensors (" + e.what_without_backtrace() +
          "). The checkpoint stages " + std::to_string(capacity()) +
          " bytes already: free host memory, or raise the locked-memory limit (ulimit -l) where "
          "it caps pinned memory.");
    }
    used_ = 0;
  }
  at::Tensor piece = slabs_[slab_].narrow(0, static_cast<int64_t>(used_), static_cast<int64_t>(nbytes));
  used_ += want;
  return piece;
}

size_t PinnedArena::capacity() const {
  size_t n = 0;
  for (const auto& s : slabs_) n += static_cast<size_t>(s.numel());
  return n;
}

DeviceCopies::~DeviceCopies() {
  try {
    synchronize();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor cannot throw; the save failed anyway
  }
}

void DeviceCopies::add(const at::Tensor& src, const at::Tensor& dst, bool deferred) {
  copies_.push_back({src, dst, deferred});
}

uint64_t DeviceCopies::bytes(bool deferred) const {
  uint64_t n = 0;
  for (const Copy& c : copies_) {
    if (c.deferred == deferred) n += static_cast<uint64_t>(c.src.numel()) * c.src.element_size();
  }
  return n;
}

void DeviceCopies::launch() {
  std::vector<c10::Device> devices;
  for (const Copy& c : copies_) {
    if (std::find(devices.begin(), devices.end(), c.src.device()) == devices.end()) {
      devices.push_back(c.src.device());
    }
  }
  for (const c10::Device& device : devices) {
    const c10::impl::VirtualGuardImpl impl(device.type());
    const c10::Stream caller = impl.getStream(device);
    const c10::Stream side = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
    // The sources' producers are queued on the caller's stream (or synchronised with it).
    c10::Event produced(device.type());
    produced.record(caller);
    side.wait(produced);
    done_.emplace_back(device.type());
    const c10::StreamGuard on_side(side);  // copy_ queues on the current stream of src's device
    auto enqueue = [&](bool deferred) {
      bool any = false;
      for (const Copy& c : copies_) {
        if (c.src.device() != device || c.deferred != deferred || c.src.numel() == 0) continue;
        c.dst.copy_(c.src.reshape({-1}).view(at::kByte), /*non_blocking=*/true);
        any = true;
      }
      return any;
    };
    try {
      if (enqueue(false)) {
        // What the loop queues after save() (the next forward changes buffers) waits for these.
        c10::Event copied(device.type());
        copied.record(side);
        caller.wait(copied);
      }
      enqueue(true);
    } catch (...) {
      done_.back().record(side);  // synchronize() still waits for what was queued
      throw;
    }
    done_.back().record(side);
  }
}

void DeviceCopies::synchronize() {
  for (const c10::Event& e : done_) e.synchronize();
  done_.clear();
  copies_.clear();  // the sources may be freed and reused now
}

}  // namespace tandem::detail
