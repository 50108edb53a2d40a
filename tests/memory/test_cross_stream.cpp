// CrossStreamResource: libtorch's recordStream contract on the host. Streams are simulated: work
// is "queued" on a stream and "completed" by the test, and an event is a ticket in that queue.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <tandem/base/errors.h>
#include <tandem/memory/caching_pool.h>
#include <tandem/memory/cross_stream_resource.h>
#include <tandem/memory/host_backend.h>
#include <tandem/memory/host_memory_stack.h>
#include <tandem/memory/limiting_resource.h>

namespace tmem = tandem::memory;

namespace {

// Streams whose work completes only when the test says so.
class SimulatedStreams final : public tmem::StreamEvents {
 public:
  struct Ticket {
    std::uintptr_t stream;
    std::int64_t position;
  };

  void queue(tmem::StreamId s) {
    std::lock_guard<std::mutex> lock(mu_);
    ++queued_[s.value];
  }
  void complete(tmem::StreamId s) {
    std::lock_guard<std::mutex> lock(mu_);
    done_[s.value] = queued_[s.value];
  }
  void fail_records(bool on) { fail_records_ = on; }
  int recorded() const { return recorded_.load(); }
  int released() const { return released_.load(); }
  int waited() const { return waited_.load(); }

  Event record(tmem::StreamId s) noexcept override {
    if (fail_records_) {  // like a failed cudaEventRecord: wait for the stream instead
      complete(s);
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++recorded_;
    return new Ticket{s.value, queued_[s.value]};
  }
  bool ready(Event e) noexcept override {
    auto* t = static_cast<Ticket*>(e);
    std::lock_guard<std::mutex> lock(mu_);
    return done_[t->stream] >= t->position;
  }
  void wait(Event e) noexcept override {
    auto* t = static_cast<Ticket*>(e);
    ++waited_;
    std::lock_guard<std::mutex> lock(mu_);
    done_[t->stream] = std::max(done_[t->stream], t->position);
  }
  void release(Event e) noexcept override {
    ++released_;
    delete static_cast<Ticket*>(e);
  }

 private:
  std::mutex mu_;
  std::map<std::uintptr_t, std::int64_t> queued_, done_;
  std::atomic<bool> fail_records_{false};
  std::atomic<int> recorded_{0}, released_{0}, waited_{0};
};

constexpr tmem::StreamId kS1{0x1000}, kS2{0x2000}, kS3{0x3000};

tmem::CachingPoolOptions no_thread_cache() {
  tmem::CachingPoolOptions o;
  o.thread_cache = false;
  return o;
}

// host <- pool <- cross, with the simulated streams.
struct Fixture {
  std::shared_ptr<SimulatedStreams> streams = std::make_shared<SimulatedStreams>();
  tmem::HostBackend host;
  tmem::CachingPool pool{host, no_thread_cache()};
  tmem::CrossStreamResource cross{pool, streams};
};

}  // namespace

TEST(CrossStream, FreeWithoutRecordedStreamGoesStraightToThePool) {
  Fixture f;
  void* a = f.cross.allocate(1000, 256, kS1);
  f.cross.deallocate(a, 1000, 256, kS1);
  EXPECT_EQ(f.cross.pending_frees(), 0u);
  EXPECT_EQ(f.cross.allocate(1000, 256, kS1), a);
  f.cross.deallocate(a, 1000, 256, kS1);
  EXPECT_EQ(f.streams->recorded(), 0);
}

TEST(CrossStream, BlockUsedOnAnotherStreamIsReusedOnlyAfterThatStreamsWork) {
  Fixture f;
  void* a = f.cross.allocate(1000, 256, kS1);
  f.cross.record_stream(a, kS2);
  f.streams->queue(kS2);  // a kernel on S2 reads `a`
  f.cross.deallocate(a, 1000, 256, kS1);
  EXPECT_EQ(f.cross.pending_frees(), 1u);
  EXPECT_EQ(f.cross.pending_bytes(), 1000);
  EXPECT_EQ(f.pool.stats().allocations.current, 1) << "the pool must still hold the block";
  void* b = f.cross.allocate(1000, 256, kS1);
  EXPECT_NE(b, a) << "reused while S2 still reads it";
  f.streams->complete(kS2);
  void* c = f.cross.allocate(1000, 256, kS1);  // the allocation polls: `a` is back, best fit
  EXPECT_EQ(c, a);
  EXPECT_EQ(f.cross.pending_frees(), 0u);
  EXPECT_EQ(f.cross.pending_bytes(), 0);
  f.cross.deallocate(b, 1000, 256, kS1);
  f.cross.deallocate(c, 1000, 256, kS1);
  EXPECT_EQ(f.streams->recorded(), f.streams->released());
}

TEST(CrossStream, RecordingTheAllocationsOwnStreamCostsNothing) {
  Fixture f;
  void* a = f.cross.allocate(1000, 256, kS1);
  f.cross.record_stream(a, kS1);
  f.cross.deallocate(a, 1000, 256, kS1);
  EXPECT_EQ(f.cross.pending_frees(), 0u);
  EXPECT_EQ(f.streams->recorded(), 0);
}

TEST(CrossStream, EveryRecordedStreamMustFinish) {
  Fixture f;
  void* a = f.cross.allocate(5000, 256, kS1);
  f.cross.record_stream(a, kS2);
  f.cross.record_stream(a, kS3);
  f.cross.record_stream(a, kS3);  // noted once
  f.streams->queue(kS2);
  f.streams->queue(kS3);
  f.cross.deallocate(a, 5000, 256, kS1);
  EXPECT_EQ(f.streams->recorded(), 2);
  f.streams->complete(kS2);
  EXPECT_EQ(f.cross.process_ready(), 0u);
  f.streams->complete(kS3);
  EXPECT_EQ(f.cross.process_ready(), 1u);
  EXPECT_EQ(f.pool.stats().allocations.current, 0);
  EXPECT_EQ(f.streams->released(), 2);
}

TEST(CrossStream, WorkQueuedAfterTheFreeIsNotWaitedFor) {
  Fixture f;
  void* a = f.cross.allocate(1000, 256, kS1);
  f.cross.record_stream(a, kS2);
  f.streams->queue(kS2);
  f.cross.deallocate(a, 1000, 256, kS1);
  f.streams->complete(kS2);
  f.streams->queue(kS2);  // later work on S2 does not use `a`
  EXPECT_EQ(f.cross.process_ready(), 1u);
}

TEST(CrossStream, OutOfMemoryWaitsForPendingFreesThenRetries) {
  auto streams = std::make_shared<SimulatedStreams>();
  tmem::HostBackend host;
  tmem::LimitingResource cap(host, 6 << 20);
  tmem::CachingPoolOptions o = no_thread_cache();
  o.large_segment_size = 4 << 20;
  o.large_segment_threshold = 4 << 20;
  tmem::CachingPool pool(cap, o);
  tmem::CrossStreamResource cross(pool, streams);
  void* a = cross.allocate(3 << 20, 256, kS1);  // a 4 MiB segment
  cross.record_stream(a, kS2);
  streams->queue(kS2);
  cross.deallocate(a, 3 << 20, 256, kS1);
  ASSERT_EQ(cross.pending_frees(), 1u);
  void* b = cross.allocate(3 << 20, 256, kS3);  // a second segment exceeds the cap until `a` is gone
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(streams->waited(), 1);
  EXPECT_EQ(cross.pending_frees(), 0u);
  cross.deallocate(b, 3 << 20, 256, kS3);
  pool.release();
  EXPECT_EQ(host.outstanding_bytes(), 0);
}

TEST(CrossStream, OutOfMemoryWithNothingPendingStillThrows) {
  auto streams = std::make_shared<SimulatedStreams>();
  tmem::HostBackend host;
  tmem::LimitingResource cap(host, 4 << 20);
  tmem::CachingPool pool(cap, no_thread_cache());
  tmem::CrossStreamResource cross(pool, streams);
  EXPECT_THROW(cross.allocate(64 << 20, 256, kS1), tandem::OutOfMemoryError);
}

TEST(CrossStream, ReleaseCachedAndDestructionWaitForPendingFrees) {
  Fixture f;
  void* a = f.cross.allocate(1000, 256, kS1);
  f.cross.record_stream(a, kS2);
  f.streams->queue(kS2);
  f.cross.deallocate(a, 1000, 256, kS1);
  EXPECT_EQ(f.cross.release_cached(), static_cast<std::size_t>(2 << 20));
  EXPECT_EQ(f.host.outstanding_bytes(), 0);
  EXPECT_EQ(f.streams->waited(), 1);
  {
    tmem::CrossStreamResource scoped(f.pool, f.streams);
    void* b = scoped.allocate(1000, 256, kS1);
    scoped.record_stream(b, kS3);
    f.streams->queue(kS3);
    scoped.deallocate(b, 1000, 256, kS1);
  }
  EXPECT_EQ(f.pool.stats().allocations.current, 0);
  EXPECT_EQ(f.streams->recorded(), f.streams->released());
}

TEST(CrossStream, FailedEventRecordWaitsInsteadOfDeferring) {
  Fixture f;
  f.streams->fail_records(true);
  void* a = f.cross.allocate(1000, 256, kS1);
  f.cross.record_stream(a, kS2);
  f.streams->queue(kS2);
  f.cross.deallocate(a, 1000, 256, kS1);
  EXPECT_EQ(f.cross.pending_frees(), 0u);
  EXPECT_EQ(f.pool.stats().allocations.current, 0);
}

TEST(CrossStream, NullEventsIsAConfigError) {
  tmem::HostBackend host;
  EXPECT_THROW(tmem::CrossStreamResource(host, nullptr), tandem::ConfigError);
}

TEST(CrossStream, ThreadsRecordingAndFreeingConcurrentlyLoseNothing) {
  auto streams = std::make_shared<SimulatedStreams>();
  tmem::HostBackend host;
  tmem::CachingPool pool(host);
  tmem::CrossStreamResource cross(pool, streams);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      const tmem::StreamId own{static_cast<std::uintptr_t>(0x100 * (t + 1))};
      for (int i = 0; i < 500; ++i) {
        const std::size_t n = 64 + rng() % 70000;
        void* p = cross.allocate(n, 256, own);
        if (rng() % 2 == 0) {
          const tmem::StreamId other{0x9000 + rng() % 3};
          cross.record_stream(p, other);
          streams->queue(other);
        }
        cross.deallocate(p, n, 256, own);
        if (rng() % 8 == 0) streams->complete({0x9000 + rng() % 3});
      }
    });
  }
  for (auto& th : threads) th.join();
  cross.wait_pending();
  EXPECT_EQ(cross.pending_frees(), 0u);
  EXPECT_EQ(cross.pending_bytes(), 0);
  EXPECT_EQ(pool.stats().allocations.current, 0);
  EXPECT_EQ(streams->recorded(), streams->released());
}

TEST(MemoryStack, StreamLayerSitsBetweenStatisticsAndThePool) {
  tmem::MemoryStackOptions o;
  o.tracking = true;
  o.tracking_options.report_at_exit = false;
  o.stream_events = std::make_shared<SimulatedStreams>();
  tmem::MemoryStack stack(std::make_unique<tmem::HostBackend>(), o);
  ASSERT_NE(stack.cross_stream(), nullptr);
  ASSERT_NE(stack.statistics(), nullptr);
  EXPECT_EQ(&stack.statistics()->upstream(), stack.cross_stream());
  EXPECT_EQ(&stack.cross_stream()->upstream(), &stack.pool());
  EXPECT_EQ(&stack.top(), stack.tracking());
  void* p = stack.top().allocate(1000, 256, kS1);
  stack.cross_stream()->record_stream(p, kS2);
  stack.top().deallocate(p, 1000, 256, kS1);
  const auto s = stack.stats();
  EXPECT_EQ(s.requests.current, 0) << "the caller's free is counted at once";
  EXPECT_EQ(s.allocations.current, 1) << "the pool holds the block until S2 is done";
  EXPECT_EQ(stack.tracking()->live_bytes(), 0);
  tmem::HostMemoryStack host_stack;  // the host stack: no stream layer
  EXPECT_EQ(host_stack.cross_stream(), nullptr);
  EXPECT_EQ(&host_stack.backend(), &host_stack.MemoryStack::backend());
}
