// Alignment negotiation: a CachingPool with default options (segments asked page-aligned) works
// over an upstream that guarantees less, as cudaMalloc does (256 bytes), and refuses clearly what
// neither it nor the upstream can honour. Runs on the host: the backend below plays cudaMalloc.
#include <gtest/gtest.h>

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <tandem/base/errors.h>
#include <tandem/memory/caching_pool.h>
#include <tandem/memory/host_backend.h>
#include <tandem/memory/limiting_resource.h>
#include <tandem/memory/statistics_resource.h>

namespace tmem = tandem::memory;

namespace {

// Host memory with cudaMalloc's contract: alignment up to `max` and no more, and never more
// than that in practice either (every pointer is an odd multiple of `max`), so a pool that
// relied on more would hand out misaligned blocks. Records the alignments asked of it.
class NarrowBackend final : public tmem::MemoryResource {
 public:
  explicit NarrowBackend(std::size_t max) : max_(max) {}

  std::set<std::size_t> asked() const {
    std::lock_guard<std::mutex> lock(mu_);
    return asked_;
  }
  std::int64_t outstanding() const { return host_.outstanding_bytes(); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, tmem::StreamId) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      asked_.insert(alignment);
    }
    if (alignment > max_)
      throw tandem::ConfigError("NarrowBackend supports alignments up to " + std::to_string(max_) + ", got " +
                                std::to_string(alignment));
    auto* base = static_cast<char*>(host_.allocate(bytes + max_, 2 * max_));
    return base + max_;  // aligned to max_, not to 2 * max_
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t, tmem::StreamId) noexcept override {
    host_.deallocate(static_cast<char*>(p) - max_, bytes + max_, 2 * max_);
  }
  std::size_t do_max_alignment() const noexcept override { return max_; }

  tmem::HostBackend host_;
  std::size_t max_;
  mutable std::mutex mu_;
  std::set<std::size_t> asked_;
};

bool aligned(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

}  // namespace

TEST(AlignmentNegotiation, DefaultOptionsWorkOverAnUpstreamGuaranteeing256Bytes) {
  NarrowBackend narrow(256);
  tmem::CachingPool pool(narrow);  // default options: segment_alignment 4096
  EXPECT_EQ(pool.options().segment_alignment, 4096u);
  EXPECT_EQ(pool.block_alignment(), 256u);
  EXPECT_EQ(pool.max_alignment(), 256u);
  struct Live {
    void* p;
    std::size_t n, a;
  };
  std::vector<Live> live;
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{1000}, std::size_t{300000},
                        std::size_t{(2u << 20) + 1}, std::size_t{30u << 20}}) {
    for (std::size_t a : {std::size_t{0}, std::size_t{64}, std::size_t{256}}) {
      void* p = pool.allocate(n, a);
      ASSERT_NE(p, nullptr);
      EXPECT_TRUE(aligned(p, 256)) << n << " bytes at " << p;
      live.push_back({p, n, a});
    }
  }
  EXPECT_EQ(narrow.asked(), (std::set<std::size_t>{256})) << "segments must be asked for what the upstream honours";
  for (const Live& l : live) pool.deallocate(l.p, l.n, l.a);
  const auto misses = pool.stats().cache_misses;
  void* again = pool.allocate(1000, 256);  // served from the cache: 256-byte requests stay cached
  EXPECT_EQ(pool.stats().cache_misses, misses);
  EXPECT_TRUE(aligned(again, 256));
  pool.deallocate(again, 1000, 256);
  pool.release();
  EXPECT_EQ(narrow.outstanding(), 0);
}

TEST(AlignmentNegotiation, MoreThanTheUpstreamHonoursIsRefusedClearly) {
  NarrowBackend narrow(256);
  tmem::CachingPool pool(narrow);
  try {
    pool.allocate(1000, 512);  // above the blocks' 256: a dedicated upstream allocation, refused
    FAIL() << "expected tandem::ConfigError";
  } catch (const tandem::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("up to 256"), std::string::npos) << e.what();
  }
  const auto s = pool.stats();
  EXPECT_EQ(s.allocations.current, 0);
  EXPECT_EQ(s.ooms, 0) << "an unsupported alignment is not an out-of-memory";
  EXPECT_EQ(narrow.outstanding(), 0);
}

TEST(AlignmentNegotiation, HostMemoryKeepsPageAlignedSegmentsAndLargeAlignments) {
  tmem::HostBackend host;
  EXPECT_EQ(host.max_alignment(), tmem::kAnyAlignment);
  tmem::CachingPool pool(host);
  EXPECT_EQ(pool.block_alignment(), 512u);  // min_block_size: blocks start at 512-byte steps
  void* p = pool.allocate(100, 512);
  void* q = pool.allocate(100, 8192);  // dedicated, as before
  EXPECT_TRUE(aligned(p, 512));
  EXPECT_TRUE(aligned(q, 8192));
  EXPECT_EQ(pool.stats().segments.current, 2);
  pool.deallocate(p, 100, 512);
  pool.deallocate(q, 100, 8192);
  pool.release();
  EXPECT_EQ(host.outstanding_bytes(), 0);
}

TEST(AlignmentNegotiation, SmallerSegmentAlignmentOptionIsKept) {
  NarrowBackend narrow(4096);
  tmem::CachingPoolOptions o;
  o.segment_alignment = 1024;
  tmem::CachingPool pool(narrow, o);
  EXPECT_EQ(pool.block_alignment(), 512u);
  void* p = pool.allocate(100);
  EXPECT_EQ(narrow.asked(), (std::set<std::size_t>{1024}));
  pool.deallocate(p, 100);
}

TEST(AlignmentNegotiation, AdaptorsReportTheirUpstreamsGuarantee) {
  NarrowBackend narrow(256);
  tmem::LimitingResource cap(narrow, 64 << 20);
  tmem::CachingPool pool(cap);
  tmem::StatisticsResource stats(pool);
  EXPECT_EQ(cap.max_alignment(), 256u);
  EXPECT_EQ(stats.max_alignment(), 256u);
  EXPECT_EQ(pool.block_alignment(), 256u);
}

TEST(AlignmentNegotiation, UpstreamReportingANonPowerOfTwoIsAConfigError) {
  struct Odd final : tmem::MemoryResource {
    void* do_allocate(std::size_t, std::size_t, tmem::StreamId) override { return nullptr; }
    void do_deallocate(void*, std::size_t, std::size_t, tmem::StreamId) noexcept override {}
    std::size_t do_max_alignment() const noexcept override { return 300; }
  } odd;
  try {
    tmem::CachingPool pool(odd);
    FAIL() << "expected tandem::ConfigError";
  } catch (const tandem::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("max_alignment() must be a power of two, got 300"), std::string::npos)
        << e.what();
  }
}
