// NVTX ranges for Nsight Systems (include/tandem/base/trace.h): the CUDA toolkit's header-only
// nvtx3, which finds the profiler's injection library at run time (dlopen), so nothing is linked
// and a build with it still runs where CUDA is absent. Compiled to no-ops without the headers.
#include <tandem/base/trace.h>

#if defined(TANDEM_HAVE_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace tandem::trace {

std::atomic<bool> detail::g_nvtx{false};

bool nvtx_available() noexcept {
#if defined(TANDEM_HAVE_NVTX)
  return true;
#else
  return false;
#endif
}

uint64_t nvtx_start(const char* name) noexcept {
#if defined(TANDEM_HAVE_NVTX)
  if (!nvtx()) return 0;
  const nvtxRangeId_t id = nvtxRangeStartA(name);
  return id == 0 ? 1 : id;  // 0 means "no range" here
#else
  (void)name;
  return 0;
#endif
}

void nvtx_end(uint64_t id) noexcept {
#if defined(TANDEM_HAVE_NVTX)
  if (id != 0) nvtxRangeEnd(id);
#else
  (void)id;
#endif
}

}  // namespace tandem::trace
