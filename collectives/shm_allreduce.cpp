#include "collectives/shm_allreduce.h"

#include "collectives/async_work.h"
#include "collectives/cast_kernels.h"
#include "collectives/gloo_store_adapter.h"
#include "collectives/reduce_kernels.h"
#include "collectives/tensor_checks.h"

#include <tandem/base/errors.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <ATen/ops/from_blob.h>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <random>

namespace tandem {

namespace detail {

constexpr uint64_t kMagic = 0x6d68732d6d646e74ULL;  // "tndm-shm"
constexpr uint32_t kVersion = 1;

static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory sync needs lock-free u32");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory sync needs lock-free u64");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "the futex word must be a u32");

struct Header {
  uint64_t magic;
  uint32_t version;
  int32_t size;
  uint64_t slot_bytes;
  uint64_t total_bytes;
  // Bumped by every publish and by abort/close: the futex sleepers wait on it.
  alignas(64) std::atomic<uint32_t> epoch;
  // Ranks inside (or about to enter) FUTEX_WAIT; publishers skip the wake syscall when zero.
  alignas(64) std::atomic<uint32_t> sleepers;
  // 0, or (cause << 24) | (1 + the rank that stopped the communicator): the first one wins.
  alignas(64) std::atomic<uint32_t> abort_word;
};

enum AbortCause : uint32_t { kAborted = 1, kMismatch = 2 };

// Sets the abort word unless already set, and wakes every sleeper.
void stop(Header* header, AbortCause cause, int rank) {
  uint32_t none = 0;
  header->abort_word.compare_exchange_strong(none, (cause << 24) | static_cast<uint32_t>(rank + 1));
  header->epoch.fetch_add(1);
}

// Written only by its rank. The op identity fields are plain: written before `progress` is
// released for the op's first step and read by peers after acquiring it; the owner rewrites them
// only after every peer passed that step (see the buffer-reuse argument in the header).
struct alignas(128) RankBlock {
  std::atomic<uint64_t> progress;  // 2s-1: contributed step s; 2s: reduced its chunk of step s
  std::atomic<uint32_t> closed;    // 1 once its communicator is destroyed
  int32_t op_dtype;
  int32_t op_reduce;
  uint64_t op_seq;
  uint64_t op_bytes;
};

constexpr size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
constexpr size_t kRanksOffset = round_up(sizeof(Header), 128);
size_t data_offset(int size) { return round_up(kRanksOffset + size * sizeof(RankBlock), 4096); }

}  // namespace detail

using namespace detail;

namespace {

using Clock = std::chrono::steady_clock;

// Spin this long before sleeping: on a 2-core machine with 2 ranks a longer spin steals the peer's
// CPU, a shorter one pays a futex wake-up (tens of microseconds under a hypervisor) per step.
constexpr auto kSpin = std::chrono::microseconds(20);
// Longest sleep between checks of abort, peer presence and the timeout.
constexpr auto kSleepSlice = std::chrono::milliseconds(10);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Not FUTEX_PRIVATE: the word is shared between processes (keyed by the shm page).
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

std::string op_summary(uint64_t seq, uint64_t bytes, int dtype, int op) {
  return "collective #" + std::to_string(seq) + " (" + to_string(static_cast<ReduceOp>(op)) +
         ", " + format_bytes(bytes) + " " + dtype_name(static_cast<at::ScalarType>(dtype)) + ")";
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

constexpr const char* kSegmentPrefix = "/tandem-shm-";
// Older than any connect's window between creating a segment and its creator's presence lock.
constexpr std::chrono::seconds kAbandonedAge{10};

std::string unique_segment_name() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%d-%016llx", kSegmentPrefix, static_cast<int>(::getpid()),
                static_cast<unsigned long long>(r));
  return buf;
}

// Printed once, by rank 0, when the ranks share a host but cannot share memory: silently
// falling back would hide a /dev/shm that is too small or not shared between containers.
void warn_fallback(const std::string& prefix, const std::string& why) {
  std::fprintf(stderr,
               "tandem: shared-memory allreduce unavailable for '%s' (%s); allreduce uses TCP "
               "loopback. GlooOptions::shared_memory = false silences this.\n",
               prefix.c_str(), why.c_str());
}

}  // namespace

std::string shm_host_identity() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(host) + "/" + read_first_line("/proc/sys/kernel/random/boot_id");
}

size_t ShmAllreduce::segment_bytes(int size, size_t slot_bytes) {
  return data_offset(size) + 2 * static_cast<size_t>(size + 1) * slot_bytes;
}

ShmAllreduce::ShmAllreduce(ShmSegment segment, int rank, int size, size_t slot_bytes,
                           std::vector<int> world_ranks, std::chrono::milliseconds timeout)
    : segment_(std::move(segment)),
      rank_(rank),
      size_(size),
      slot_bytes_(slot_bytes),
      world_ranks_(std::move(world_ranks)),
      timeout_(timeout) {
  char* base = static_cast<char*>(segment_.data());
  header_ = reinterpret_cast<Header*>(base);
  ranks_ = reinterpret_cast<RankBlock*>(base + kRanksOffset);
  data_ = base + data_offset(size_);
}

ShmAllreduce::~ShmAllreduce() {
  ranks_[rank_].closed.store(1, std::memory_order_release);
  header_->epoch.fetch_add(1);
  futex_wake_all(&header_->epoch);
  // segment_ unmaps and closes its descriptor, releasing this rank's presence lock.
}

char* ShmAllreduce::slot(int buffer, int r) const {
  return data_ + (static_cast<size_t>(buffer) * (size_ + 1) + r) * slot_bytes_;
}

std::string ShmAllreduce::rank_name(int r) const {
  return "rank " + std::to_string(r) + " (world rank " + std::to_string(world_ranks_[r]) + ")";
}

void ShmAllreduce::publish(uint64_t progress) {
  ranks_[rank_].progress.store(progress, std::memory_order_release);
  header_->epoch.fetch_add(1);  // seq_cst: ordered before the sleeper count read below
  if (header_->sleepers.load() != 0) futex_wake_all(&header_->epoch);
}

void ShmAllreduce::abort() {
  stop(header_, kAborted, rank_);
  futex_wake_all(&header_->epoch);
}

int ShmAllreduce::first_behind(uint64_t target) const {
  for (int q = 0; q < size_; ++q) {
    if (ranks_[q].progress.load(std::memory_order_acquire) < target) return q;
  }
  return -1;
}

void ShmAllreduce::wait_progress(uint64_t target, const char* what, uint64_t segment,
                                 uint64_t segments) {
  int lagging = first_behind(target);
  if (lagging < 0) return;
  auto where = [&] {
    return std::string(what) + " segment " + std::to_string(segment) + " of " +
           std::to_string(segments);
  };
  const auto start = Clock::now();
  for (unsigned i = 0;; ++i) {
    cpu_relax();
    if ((lagging = first_behind(target)) < 0) return;
    if ((i & 63) == 63 && Clock::now() - start > kSpin) break;
  }
  auto next_presence_check = start;
  for (;;) {
    const uint32_t epoch = header_->epoch.load();
    if ((lagging = first_behind(target)) < 0) return;
    if (const uint32_t word = header_->abort_word.load(std::memory_order_acquire); word != 0) {
      throw CommError("shared-memory allreduce stopped while waiting for " + rank_name(lagging) +
                      " to " + where() + ": " + abort_reason(word));
    }
    const auto now = Clock::now();
    if (now >= next_presence_check) {
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        const bool closed = ranks_[q].closed.load(std::memory_order_acquire) != 0;
        if (!closed && segment_.presence_held_by_other(static_cast<size_t>(q))) continue;
        // Gone. Fine if it did its part of this wait before leaving (its writes are visible).
        if (ranks_[q].progress.load(std::memory_order_acquire) >= target) continue;
        throw CommError("shared-memory allreduce: " + rank_name(q) +
                        (closed ? " destroyed its communicator"
                                : " is gone (its process exited or was killed)") +
                        " while this rank waited for it to " + where());
      }
      next_presence_check = now + kSleepSlice;
    }
    const auto elapsed = now - start;
    if (elapsed >= timeout_) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.2f s",
                    std::chrono::duration<double>(elapsed).count());
      throw TimeoutError("shared-memory allreduce timed out after " + std::string(secs) +
                         " waiting for " + rank_name(lagging) + " to " + where());
    }
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_ - elapsed);
    header_->sleepers.fetch_add(1);
    if (header_->epoch.load() == epoch) {
      futex_wait(&header_->epoch, epoch, std::min<std::chrono::nanoseconds>(left, kSleepSlice));
    }
    header_->sleepers.fetch_sub(1);
  }
}

std::string ShmAllreduce::abort_reason(uint32_t abort_word) const {
  const int r = static_cast<int>(abort_word & 0xffffff) - 1;
  if ((abort_word >> 24) == kMismatch) {
    return rank_name(r) + " found that the ranks issued different collectives";
  }
  return r == rank_ ? std::string("the communicator was aborted on this rank")
                    : rank_name(r) + " aborted its communicator";
}

void ShmAllreduce::check_same_op(uint64_t op_seq, uint64_t bytes, int dtype, int op) const {
  for (int q = 0; q < size_; ++q) {
    const RankBlock& b = ranks_[q];
    if (b.op_seq == op_seq && b.op_bytes == bytes && b.op_dtype == dtype && b.op_reduce == op) {
      continue;
    }
    stop(header_, kMismatch, rank_);
    futex_wake_all(&header_->epoch);
    throw CommError("shared-memory allreduce: the ranks issued different collectives: " +
                    rank_name(rank_) + " runs " + op_summary(op_seq, bytes, dtype, op) +
                    " but " + rank_name(q) + " runs " +
                    op_summary(b.op_seq, b.op_bytes, b.op_dtype, b.op_reduce) +
                    ". Every rank must issue the same collectives, with the same sizes, in the "
                    "same order");
  }
}

// How an op's elements move between the caller's tensor and the segment.
struct ShmAllreduce::Transfer {
  size_t user_size;  // bytes per element in the caller's tensor
  size_t wire_size;  // bytes per element in the segment
  // `n` elements from the tensor into the segment, and from the segment into the tensor.
  std::function<void(const char* from, char* to, size_t n)> in, out;
  bool plain;  // in and out are copies: the reduction reads this rank's chunk from the tensor
};

void ShmAllreduce::allreduce(const at::Tensor& buffer, ReduceOp op, uint64_t op_seq) {
  const size_t esize = buffer.element_size();
  auto copy = [esize](const char* from, char* to, size_t n) { std::memcpy(to, from, n * esize); };
  run(buffer, buffer.scalar_type(), op, Transfer{esize, esize, copy, copy, true}, op_seq);
}

void ShmAllreduce::allreduce_narrowed(const at::Tensor& buffer, at::ScalarType wire,
                                      float divisor, uint64_t op_seq) {
  const kernels::CastKernels& k = kernels::cast_kernels();
  const auto narrow = wire == at::kHalf ? k.to_half : k.to_bf16;
  const auto widen = wire == at::kHalf ? k.from_half : k.from_bf16;
  const Transfer t{
      sizeof(float), sizeof(uint16_t),
      [narrow, divisor](const char* f, char* to, size_t n) {
        narrow(reinterpret_cast<const float*>(f), reinterpret_cast<uint16_t*>(to), n, divisor);
      },
      [widen](const char* f, char* to, size_t n) {
        widen(reinterpret_cast<const uint16_t*>(f), reinterpret_cast<float*>(to), n);
      },
      false};
  run(buffer, wire, ReduceOp::kSum, t, op_seq);
}

void ShmAllreduce::run(const at::Tensor& buffer, at::ScalarType wire, ReduceOp op,
                       const Transfer& t, uint64_t op_seq) {
  const size_t numel = static_cast<size_t>(buffer.numel());
  const ReduceFn fn = reduce_kernel(wire, op);
  if (const uint32_t word = header_->abort_word.load(std::memory_order_acquire); word != 0) {
    throw CommError("shared-memory allreduce refused: " + abort_reason(word));
  }
  if (numel == 0) return;

  // The op's identity is what travels: a narrowed op matches a plain one of the wire dtype.
  RankBlock& me = ranks_[rank_];
  me.op_seq = op_seq;
  me.op_bytes = numel * t.wire_size;
  me.op_dtype = static_cast<int32_t>(wire);
  me.op_reduce = static_cast<int32_t>(op);

  char* const base = static_cast<char*>(buffer.data_ptr());
  const size_t ws = t.wire_size;
  const size_t seg_elems = slot_bytes_ / ws;
  const size_t align = 64 / ws;  // chunk boundaries on cache lines: no false sharing
  const uint64_t steps = (numel + seg_elems - 1) / seg_elems;
  for (uint64_t k = 0; k < steps; ++k) {
    const uint64_t s = ++step_;
    const int b = static_cast<int>(s & 1);
    const size_t n = std::min(seg_elems, numel - k * seg_elems);
    const size_t chunk = round_up((n + size_ - 1) / size_, align);
    const size_t lo = std::min(n, rank_ * chunk);
    const size_t hi = std::min(n, (rank_ + 1) * chunk);
    char* const src = base + k * seg_elems * t.user_size;
    char* const mine = slot(b, rank_);
    char* const result = slot(b, size_);

    // 1. Contribute: the peers need every chunk but ours.
    t.in(src, mine, lo);
    t.in(src + hi * t.user_size, mine + hi * ws, n - hi);
    publish(2 * s - 1);
    wait_progress(2 * s - 1, "contribute", k + 1, steps);
    if (k == 0) check_same_op(op_seq, numel * ws, me.op_dtype, me.op_reduce);

    // 2. Reduce chunk `rank_` over ranks 0..size-1, in that order, into the result area. Our own
    // part is read from the tensor, or narrowed into our slot (where no peer reads) first.
    if (hi > lo) {
      const size_t off = lo * ws;
      if (!t.plain) t.in(src + lo * t.user_size, mine + off, hi - lo);
      auto input = [&](int q) -> const char* {
        return q == rank_ && t.plain ? src + off : slot(b, q) + off;
      };
      fn(result + off, input(0), input(1), hi - lo);
      for (int q = 2; q < size_; ++q) fn(result + off, result + off, input(q), hi - lo);
      if (op == ReduceOp::kAvg) {
        at::from_blob(result + off, {static_cast<int64_t>(hi - lo)}, buffer.options()).div_(size_);
      }
    }
    publish(2 * s);
    wait_progress(2 * s, "reduce its chunk of", k + 1, steps);

    // 3. Everyone's chunks, ours included, back into the tensor.
    t.out(result, src, n);
  }
}

std::unique_ptr<ShmAllreduce> connect_shm_allreduce(const c10::intrusive_ptr<c10d::Store>& store,
                                                    const std::string& prefix, int rank,
                                                    const std::vector<int>& world_ranks,
                                                    const GlooOptions& options) {
  const int size = static_cast<int>(world_ranks.size());
  if (size < 2) return nullptr;
  auto shm_store = c10::make_intrusive<c10d::PrefixStore>(prefix + "/shm", store);
  GlooStoreAdapter waiter(shm_store,
                          "shared-memory setup of " + std::to_string(size) + " ranks under '" +
                              prefix + "' (this is world rank " +
                              std::to_string(world_ranks[rank]) + ")",
                          size);
  auto set = [&](const std::string& key, const std::string& value) {
    shm_store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  };
  auto get = [&](const std::string& key) {
    const auto v = shm_store->get(key);
    return std::string(v.begin(), v.end());
  };
  auto wait_all = [&](const std::string& stem) {
    std::vector<std::string> keys;
    for (int q = 0; q < size; ++q) keys.push_back(stem + std::to_string(q));
    waiter.wait(keys, options.timeout);
  };

  // 1. Same host, and shared memory wanted everywhere?
  const std::string host = options.shared_memory ? shm_host_identity() : std::string("off");
  set("host" + std::to_string(rank), host);
  wait_all("host");
  bool same_host = host != "off";
  for (int q = 0; q < size && same_host; ++q) same_host = get("host" + std::to_string(q)) == host;
  if (!same_host) return nullptr;

  // 2. Rank 0 creates the segment; its geometry travels with the name.
  size_t slot_bytes = round_up(std::max<size_t>(options.shared_memory_slot_bytes, 4096), 4096);
  ShmSegment segment;
  std::string failure;
  if (rank == 0) {
    const size_t bytes = ShmAllreduce::segment_bytes(size, slot_bytes);
    std::string published;
    try {
      // Names a creator killed inside an earlier connect left behind (nobody else knew them).
      ShmSegment::remove_abandoned(kSegmentPrefix, kAbandonedAge);
      segment = ShmSegment::create(unique_segment_name(), bytes);
      char* base = static_cast<char*>(segment.data());
      auto* header = new (base) Header();
      header->version = kVersion;
      header->size = size;
      header->slot_bytes = slot_bytes;
      header->total_bytes = bytes;
      for (int q = 0; q < size; ++q) new (base + kRanksOffset + q * sizeof(RankBlock)) RankBlock();
      header->magic = kMagic;
      published = segment.name() + " " + std::to_string(slot_bytes);
    } catch (const std::exception& e) {
      published = std::string("!") + e.what();
      segment = ShmSegment();
    }
    set("name", published);
    if (published[0] == '!') {
      warn_fallback(prefix, published.substr(1));
      return nullptr;
    }
  } else {
    waiter.wait({"name"}, options.timeout);
    const std::string published = get("name");
    if (published.empty() || published[0] == '!') return nullptr;
    const size_t space = published.find(' ');
    const std::string name = published.substr(0, space);
    slot_bytes = std::stoull(published.substr(space + 1));
    try {
      segment = ShmSegment::open(name, ShmAllreduce::segment_bytes(size, slot_bytes));
      const auto* header = static_cast<const Header*>(segment.data());
      if (header->magic != kMagic || header->version != kVersion || header->size != size ||
          header->slot_bytes != slot_bytes) {
        throw CommError("tandem: shared memory: '/dev/shm" + name + "' has an unexpected header");
      }
      segment.hold_presence(static_cast<size_t>(rank));
    } catch (const std::exception& e) {
      failure = e.what();
      segment = ShmSegment();
    }
  }
  set("ok" + std::to_string(rank), failure.empty() ? "1" : "0" + failure);

  // 3. Everyone mapped it (or failed): the name goes, the mappings stay.
  try {
    wait_all("ok");
  } catch (...) {
    segment.unlink();
    throw;
  }
  segment.unlink();
  bool all_ok = true;
  for (int q = 0; q < size; ++q) {
    const std::string ok = get("ok" + std::to_string(q));
    if (ok == "1") continue;
    if (all_ok && rank == 0) {
      warn_fallback(prefix, "rank " + std::to_string(q) + ": " + ok.substr(1));
    }
    all_ok = false;
  }
  if (!all_ok) return nullptr;
  return std::make_unique<ShmAllreduce>(std::move(segment), rank, size, slot_bytes, world_ranks,
                                        options.timeout);
}

}  // namespace tandem
