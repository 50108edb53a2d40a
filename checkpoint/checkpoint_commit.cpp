// One save's two-phase commit across ranks: every rank writes its shard, the ranks exchange
// reports, rank 0 commits the manifest, the verdict is broadcast (see
// include/tandem/checkpoint/checkpoint_manager.h and checkpoint/step_directory.h).
#include "checkpoint/checkpoint_manager_impl.h"

#include <tandem/base/errors.h>
#include <tandem/base/trace.h>

#include <ATen/ops/empty.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace tandem {

using namespace detail;

namespace {
std::atomic<double> last_commit_time{0};
}  // namespace

double last_checkpoint_commit_time() { return last_commit_time.load(); }

int64_t CheckpointManager::Impl::allreduce_int(int64_t v, ReduceOp op) const {
  if (!comm) return v;
  at::Tensor t = at::empty({1}, at::kLong);
  t.data_ptr<int64_t>()[0] = v;
  comm->allreduce(t, op)->wait();
  return t.data_ptr<int64_t>()[0];
}

std::vector<ShardReport> CheckpointManager::Impl::exchange_reports(const ShardReport& mine, bool ok,
                                                                   std::vector<int>* failed) const {
  std::vector<ShardReport> all;
  if (!comm) {
    if (!ok) failed->push_back(rank);
    all.push_back(mine);
    return all;
  }
  constexpr int kFields = 5;
  at::Tensor in = at::empty({kFields}, at::kLong);
  at::Tensor out = at::empty({kFields * world}, at::kLong);
  int64_t* p = in.data_ptr<int64_t>();
  p[0] = ok ? 1 : 0;
  p[1] = mine.wrote ? 1 : 0;
  p[2] = static_cast<int64_t>(mine.bytes);
  std::memcpy(&p[3], &mine.xxh3, sizeof(uint64_t));
  p[4] = static_cast<int64_t>(mine.header_bytes);
  comm->allgather(out, in)->wait();
  const int64_t* q = out.data_ptr<int64_t>();
  for (int r = 0; r < world; ++r) {
    const int64_t* f = q + r * kFields;
    ShardReport rep;
    rep.rank = r;
    rep.wrote = f[1] != 0;
    rep.bytes = static_cast<uint64_t>(f[2]);
    std::memcpy(&rep.xxh3, &f[3], sizeof(uint64_t));
    rep.header_bytes = static_cast<uint64_t>(f[4]);
    if (f[0] == 0) failed->push_back(r);
    all.push_back(rep);
  }
  return all;
}

std::string CheckpointManager::Impl::failure_cause(const std::string& local_error,
                                                   const std::vector<int>& failed,
                                                   const std::string& commit_error) const {
  if (!local_error.empty()) {
    std::string cause = "rank " + std::to_string(rank) + " could not write its shard: " + strip_prefix(local_error);
    if (local_error.find(std::strerror(ENOSPC)) != std::string::npos) {
      // keep_last = K checkpoints stay while the next one is written: K + 1 at once.
      const int k = opts.keep_last;
      cause += " Each save writes a new checkpoint before the oldest is removed" +
               (k > 0 ? ", so checkpoint.keep_last = " + std::to_string(k) + " needs room for " +
                            std::to_string(k + 1) + " checkpoints"
                      : std::string(" (checkpoint.keep_last = 0 keeps them all)")) +
               ": lower --set checkpoint.keep_last, free space, or move --set checkpoint.directory.";
    }
    return cause;
  }
  if (!failed.empty()) {
    std::string ranks;
    for (const int r : failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    return "rank(s) " + ranks + " failed to write their shards (see their errors).";
  }
  return rank == 0 ? strip_prefix(commit_error) : "rank 0 failed to commit it (see its error).";
}

std::string CheckpointManager::Impl::after_failed_save(int64_t step) const {
  // The partial step directory would only make the next attempt fail the same way (a full disk):
  // rank 0 removes it once every rank is done writing (the reports were exchanged).
  std::string removed;
  if (rank == 0) {
    const std::string staging = staging_directory(opts.directory, step);
    try {
      if (fs->exists(staging)) {
        fs->remove_all(staging);
        removed = " Its partial directory " + staging + " was removed.";
      }
    } catch (const std::exception& e) {
      removed = " Removing its partial directory " + staging + " failed too: " + strip_prefix(e.what());
    }
  }
  bool previous = false;
  try {
    previous = !list_steps(*fs, opts.directory).committed.empty();
  } catch (const std::exception&) {
  }
  return removed + (previous ? " The previous checkpoint stays the newest valid one."
                             : " There is no earlier checkpoint: a restart now starts from the beginning.");
}

SaveStats CheckpointManager::Impl::run_job(Job& job) {
  SaveStats s;
  s.step = job.step;
  s.blocked_s = job.blocked_s;
  ShardReport mine;
  mine.rank = rank;
  std::string local_error;
  // Whether trying again could help, kept through the message's rewording (a directory that
  // cannot be written stays so: tandemrun must not restart for it).
  bool restartable = true;
  auto note = [&restartable](const std::exception& e) {
    if (const auto* error = dynamic_cast<const Error*>(&e)) restartable &= error->restartable();
  };
  const auto t_write = Clock::now();
  try {
    trace::Span span("checkpoint write", trace::kCheckpoint);
    if (trace::enabled()) span.arg("step", job.step);
    // A torn snapshot is reported like a failed write: every rank still runs the commit's
    // collectives, and the step is not committed anywhere.
    if (!job.staging_error.empty()) throw CheckpointError("tandem: checkpoint: " + job.staging_error);
    if (job.has_file) {
      const ShardWriteResult w = write_shard(*fs, opts.directory, job.step, rank, world,
                                             std::move(job.sources), job.values);
      mine.wrote = true;
      mine.bytes = w.bytes;
      mine.xxh3 = w.xxh3;
      mine.header_bytes = w.header_bytes;
    }
  } catch (const CrashError&) {
    throw;  // simulated process death: nothing more happens on this rank
  } catch (const std::exception& e) {
    local_error = e.what();
    note(e);
  }
  s.write_s = seconds_since(t_write);
  s.bytes = mine.bytes;
  const auto t_commit = Clock::now();
  trace::Span commit_span("checkpoint commit", trace::kCheckpoint);
  std::vector<int> failed;
  const std::vector<ShardReport> reports = exchange_reports(mine, local_error.empty(), &failed);
  std::string commit_error;
  int64_t committed = 0;
  if (rank == 0 && failed.empty()) {
    try {
      commit_step(*fs, opts.directory, job.step, world, job.states, reports, opts.metadata);
      committed = 1;
    } catch (const CrashError&) {
      throw;
    } catch (const std::exception& e) {
      commit_error = e.what();
      note(e);
    }
  }
  if (comm) {
    at::Tensor t = at::empty({1}, at::kLong);
    t.data_ptr<int64_t>()[0] = committed;
    comm->broadcast(t, 0)->wait();
    committed = t.data_ptr<int64_t>()[0];
  }
  s.commit_s = seconds_since(t_commit);
  commit_span.end();
  s.total_s = seconds_since(job.started);
  const std::string step = "step " + std::to_string(job.step);
  if (!local_error.empty() || !failed.empty() || committed == 0) {
    throw CheckpointError("tandem: checkpoint: " + step + " was not " +
                          (local_error.empty() ? "committed: " : "saved: ") +
                          failure_cause(local_error, failed, commit_error) + after_failed_save(job.step),
                          restartable);
  }
  last_commit_time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (rank == 0) {
    auto removing = [this, step](auto&& phase) {
      try {
        phase();
      } catch (const CrashError&) {
        throw;
      } catch (const std::exception& e) {
        warn("removing old checkpoints after committing " + step + " failed: " + strip_prefix(e.what()));
      }
    };
    removing([&] { retire_old_steps(*fs, opts.directory, opts.keep_last); });
    // Unlinking the retired files (0.3 s for a 1 GiB step on the benchmark machine) is
    // housekeeping: a sync save returns without it; the writer does it, and the next save or
    // resume waits for the writer first. An async save is on the writer already.
    auto unlink = [this, removing, newest = job.step] {
      removing([&] { remove_retired_steps(*fs, opts.directory, newest); });
    };
    if (opts.async) {
      unlink();
    } else {
      writer.submit(unlink);
    }
  }
  return s;
}

}  // namespace tandem
