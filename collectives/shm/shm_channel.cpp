#include "collectives/shm/shm_channel.h"

#include "collectives/async_work.h"
#include "collectives/shm/peer_memory.h"
#include "collectives/store_wait.h"
#include "collectives/tensor_checks.h"

#include <tandem/base/errors.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

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
#include <new>
#include <random>

namespace tandem::detail {


constexpr uint64_t kMagic = 0x6d68732d6d646e74ULL;  // "tndm-shm"
constexpr uint32_t kVersion = 3;  // 2: op kinds beyond allreduce; 3: OpRecord::source

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

// An op's identity as written in shared memory.
struct OpRecord {
  int32_t kind;
  int32_t dtype;
  int32_t reduce;
  uint64_t seq;
  uint64_t bytes;
  uint64_t source;  // address of the rank's input in its own process, for read_peer()
};

// Written only by its rank. An op's identity goes into op[first step % 2], plain: written before
// `progress` is released for that step and read by peers after acquiring it. The owner rewrites
// that record for an op starting two or more steps later, after every peer arrived at the step
// before it, i.e. after every peer left the step it checked the record in (the buffer argument
// in the header), so ops that end without a final wait are safe too.
struct alignas(128) RankBlock {
  std::atomic<uint64_t> progress;  // 2s-1: arrived at step s; 2s: done with step s
  std::atomic<uint32_t> closed;    // 1 once its communicator is destroyed
  OpRecord op[2];
};

constexpr size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
constexpr size_t kRanksOffset = round_up(sizeof(Header), 128);
size_t data_offset(int size) { return round_up(kRanksOffset + size * sizeof(RankBlock), 4096); }

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

const char* kind_name(int32_t kind) {
  switch (kind) {
    case ShmOpIdentity::kAllreduce: return "allreduce";
    case ShmOpIdentity::kReduceScatter: return "reduce_scatter";
    case ShmOpIdentity::kAllgather: return "allgather";
    default: return "collective";
  }
}

std::string op_summary(const OpRecord& op) {
  const std::string reduce =
      op.reduce < 0 ? "" : std::string(to_string(static_cast<ReduceOp>(op.reduce))) + ", ";
  return std::string(kind_name(op.kind)) + " #" + std::to_string(op.seq) + " (" + reduce +
         format_bytes(op.bytes) + " " + dtype_name(static_cast<at::ScalarType>(op.dtype)) + ")";
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
void warn_fallback(const std::string& prefix, const std::string& why, const std::string& hint) {
  std::fprintf(stderr,
               "tandem: shared-memory collectives unavailable for '%s' (%s); they use TCP loopback."
               " %s silences this.\n",
               prefix.c_str(), why.c_str(), hint.c_str());
}

}  // namespace

std::string shm_host_identity() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(host) + "/" + read_first_line("/proc/sys/kernel/random/boot_id");
}

size_t ShmChannel::segment_bytes(int size, size_t slot_bytes) {
  return data_offset(size) + 2 * static_cast<size_t>(size + 1) * slot_bytes;
}

ShmChannel::ShmChannel(ShmSegment segment, int rank, int size, size_t slot_bytes,
                       std::vector<int> world_ranks, std::chrono::milliseconds timeout,
                       std::vector<int> peer_pids)
    : segment_(std::move(segment)),
      rank_(rank),
      size_(size),
      slot_bytes_(slot_bytes),
      world_ranks_(std::move(world_ranks)),
      timeout_(timeout),
      peer_pids_(std::move(peer_pids)) {
  char* base = static_cast<char*>(segment_.data());
  header_ = reinterpret_cast<Header*>(base);
  ranks_ = reinterpret_cast<RankBlock*>(base + kRanksOffset);
  data_ = base + data_offset(size_);
}

ShmChannel::~ShmChannel() {
  ranks_[rank_].closed.store(1, std::memory_order_release);
  header_->epoch.fetch_add(1);
  futex_wake_all(&header_->epoch);
  // segment_ unmaps and closes its descriptor, releasing this rank's presence lock.
}

char* ShmChannel::slot(int buffer, int r) const {
  return data_ + (static_cast<size_t>(buffer) * (size_ + 1) + r) * slot_bytes_;
}

std::string ShmChannel::rank_name(int r) const {
  return "rank " + std::to_string(r) + " (world rank " + std::to_string(world_ranks_[r]) + ")";
}

void ShmChannel::publish(uint64_t progress) {
  ranks_[rank_].progress.store(progress, std::memory_order_release);
  header_->epoch.fetch_add(1);  // seq_cst: ordered before the sleeper count read below
  if (header_->sleepers.load() != 0) futex_wake_all(&header_->epoch);
}

void ShmChannel::abort() {
  stop(header_, kAborted, rank_);
  futex_wake_all(&header_->epoch);
}

int ShmChannel::first_behind(uint64_t target) const {
  for (int q = 0; q < size_; ++q) {
    if (ranks_[q].progress.load(std::memory_order_acquire) < target) return q;
  }
  return -1;
}

void ShmChannel::wait_progress(uint64_t target, const char* what, uint64_t segment,
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
      throw PeerLostError(std::string("shared-memory ") + op_name_ + " stopped while waiting for " +
                      rank_name(lagging) + " to " + where() + ": " + abort_reason(word));
    }
    const auto now = Clock::now();
    if (now >= next_presence_check) {
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        const bool closed = ranks_[q].closed.load(std::memory_order_acquire) != 0;
        if (!closed && segment_.presence_held_by_other(static_cast<size_t>(q))) continue;
        // Gone. Fine if it did its part of this wait before leaving (its writes are visible).
        if (ranks_[q].progress.load(std::memory_order_acquire) >= target) continue;
        throw PeerLostError(std::string("shared-memory ") + op_name_ + ": " + rank_name(q) +
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
      throw TimeoutError(std::string("shared-memory ") + op_name_ + " timed out after " + secs +
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

std::string ShmChannel::abort_reason(uint32_t abort_word) const {
  const int r = static_cast<int>(abort_word & 0xffffff) - 1;
  if ((abort_word >> 24) == kMismatch) {
    return rank_name(r) + " found that the ranks issued different collectives";
  }
  return r == rank_ ? std::string("the communicator was aborted on this rank")
                    : rank_name(r) + " aborted its communicator";
}

void ShmChannel::begin_op(const ShmOpIdentity& op) {
  if (const uint32_t word = header_->abort_word.load(std::memory_order_acquire); word != 0) {
    const std::string msg = std::string("shared-memory ") + kind_name(op.kind) + " refused: " +
                            abort_reason(word);
    // Another rank aborted (it failed, or left): a lost peer, as when it happens mid-op.
    const int by = static_cast<int>(word & 0xffffff) - 1;
    if ((word >> 24) != kMismatch && by != rank_) throw PeerLostError(msg);
    throw CommError(msg);
  }
  op_name_ = kind_name(op.kind);
  op_parity_ = static_cast<int>((step_ + 1) & 1);
  ranks_[rank_].op[op_parity_] = OpRecord{op.kind, static_cast<int32_t>(op.dtype), op.reduce,
                                          op.seq, op.bytes,
                                          reinterpret_cast<uintptr_t>(op.source)};
}

void ShmChannel::read_peer(int q, void* to, size_t bytes) {
  try {
    read_peer_memory(peer_pids_.at(static_cast<size_t>(q)), ranks_[q].op[op_parity_].source, to,
                     bytes, rank_name(q));
  } catch (...) {
    abort();  // the peers wait for this rank to finish: fail them now, not at the timeout
    throw;
  }
}

void ShmChannel::arrive(uint64_t s, uint64_t segment, uint64_t segments) {
  publish(2 * s - 1);
  wait_progress(2 * s - 1, "contribute", segment, segments);
  if (segment == 1) check_same_op();
}

void ShmChannel::done(uint64_t s, bool wait, uint64_t segment, uint64_t segments) {
  publish(2 * s);
  if (wait) wait_progress(2 * s, "finish", segment, segments);
}

void ShmChannel::check_same_op() const {
  const OpRecord& mine = ranks_[rank_].op[op_parity_];
  for (int q = 0; q < size_; ++q) {
    const OpRecord& theirs = ranks_[q].op[op_parity_];
    if (theirs.kind == mine.kind && theirs.dtype == mine.dtype && theirs.reduce == mine.reduce &&
        theirs.seq == mine.seq && theirs.bytes == mine.bytes) {
      continue;
    }
    stop(header_, kMismatch, rank_);
    futex_wake_all(&header_->epoch);
    throw CommError(std::string("shared-memory ") + op_name_ +
                    ": the ranks issued different collectives: " + rank_name(rank_) + " runs " +
                    op_summary(mine) + " but " + rank_name(q) + " runs " + op_summary(theirs) +
                    ". Every rank must issue the same collectives, with the same sizes, in the "
                    "same order");
  }
}

std::unique_ptr<ShmChannel> connect_shm_channel(const c10::intrusive_ptr<c10d::Store>& store,
                                                const std::string& prefix, int rank,
                                                const std::vector<int>& world_ranks,
                                                const ShmChannelOptions& options) {
  const int size = static_cast<int>(world_ranks.size());
  if (size < 2) return nullptr;
  auto shm_store = c10::make_intrusive<c10d::PrefixStore>(prefix + "/shm", store);
  const std::string setup = "shared-memory setup of " + std::to_string(size) + " ranks under '" +
                            prefix + "' (this is world rank " + std::to_string(world_ranks[rank]) +
                            ")";
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
    wait_for_keys(*shm_store, keys, options.rendezvous_timeout, setup, size);
  };

  // 1. Same host, and shared memory wanted everywhere?
  const std::string host = options.enabled ? shm_host_identity() : std::string("off");
  set("host" + std::to_string(rank), host);
  wait_all("host");
  bool same_host = host != "off";
  for (int q = 0; q < size && same_host; ++q) same_host = get("host" + std::to_string(q)) == host;
  if (!same_host) return nullptr;

  // 2. Rank 0 creates the segment; its geometry travels with the name.
  size_t slot_bytes = round_up(std::max<size_t>(options.slot_bytes, 4096), 4096);
  ShmSegment segment;
  std::string failure;
  if (rank == 0) {
    const size_t bytes = ShmChannel::segment_bytes(size, slot_bytes);
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
      warn_fallback(prefix, published.substr(1), options.disable_hint);
      return nullptr;
    }
  } else {
    wait_for_keys(*shm_store, {"name"}, options.timeout, setup, size);
    const std::string published = get("name");
    if (published.empty() || published[0] == '!') return nullptr;
    const size_t space = published.find(' ');
    const std::string name = published.substr(0, space);
    slot_bytes = std::stoull(published.substr(space + 1));
    try {
      segment = ShmSegment::open(name, ShmChannel::segment_bytes(size, slot_bytes));
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
      warn_fallback(prefix, "rank " + std::to_string(q) + ": " + ok.substr(1), options.disable_hint);
    }
    all_ok = false;
  }
  if (!all_ok) return nullptr;

  // 4. Can every rank read every peer's memory? Then all-gathers copy once (peer_memory.h). The
  // probe word stays alive until every rank has given its verdict.
  const PeerReadProbe probe;
  set("probe" + std::to_string(rank), options.peer_reads ? probe.published() : "off");
  wait_all("probe");
  std::vector<int> pids(size);
  std::string verdict = "1";
  for (int q = 0; q < size; ++q) {
    const std::string published = get("probe" + std::to_string(q));
    if (published == "off") {
      verdict = "0";
    } else {
      pids[q] = std::stoi(published);
      if (q != rank && !PeerReadProbe::can_read(published)) verdict = "0";
    }
  }
  set("reads" + std::to_string(rank), verdict);
  wait_all("reads");
  for (int q = 0; q < size; ++q) {
    if (get("reads" + std::to_string(q)) != "1") pids.clear();
  }
  return std::make_unique<ShmChannel>(std::move(segment), rank, size, slot_bytes, world_ranks,
                                      options.timeout, std::move(pids));
}

}  // namespace tandem::detail
