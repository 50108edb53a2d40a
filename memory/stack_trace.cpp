// backtrace()-based stack capture, dladdr-based symbolisation.
#include <tandem/memory/stack_trace.h>

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace tandem::memory {

namespace {
// backtrace() loads the unwinder on first use (dlopen + malloc); do that once, early, rather
// than inside the first tracked allocation.
const bool g_unwinder_loaded = [] {
  void* frames[2];
  return ::backtrace(frames, 2) > 0;
}();
}  // namespace

std::size_t capture_stack(void** out, std::size_t max_frames, std::size_t skip) {
  (void)g_unwinder_loaded;
  constexpr std::size_t kMax = 256;
  void* buf[kMax];
  const std::size_t want = std::min(kMax, max_frames + skip + 1);
  const int got = ::backtrace(buf, static_cast<int>(want));
  std::size_t n = 0;
  for (std::size_t i = skip + 1; i < static_cast<std::size_t>(got) && n < max_frames; ++i) out[n++] = buf[i];
  return n;
}

std::uint64_t hash_stack(void* const* frames, std::size_t n) {
  const std::uint64_t h = XXH3_64bits(frames, n * sizeof(void*));
  return h == 0 ? 1 : h;  // 0 means "no stack"
}

std::string symbolize(const void* address) {
  static std::mutex mu;
  static std::unordered_map<const void*, std::string> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(address);
    if (it != cache.end()) return it->second;
  }
  // Return addresses point after the call; look up address-1 so the frame names the caller's line.
  const void* lookup = static_cast<const char*>(address) - 1;
  Dl_info info{};
  std::string text;
  char buf[64];
  if (::dladdr(lookup, &info) != 0) {
    if (info.dli_sname != nullptr) {
      int status = 0;
      char* dem = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      text = status == 0 && dem != nullptr ? dem : info.dli_sname;
      std::free(dem);
      std::snprintf(buf, sizeof buf, "+0x%zx",
                    static_cast<std::size_t>(static_cast<const char*>(address) - static_cast<const char*>(info.dli_saddr)));
      text += buf;
    }
    std::string module = info.dli_fname != nullptr ? info.dli_fname : "?";
    const auto slash = module.rfind('/');
    if (slash != std::string::npos) module = module.substr(slash + 1);
    std::snprintf(buf, sizeof buf, "+0x%zx",
                  static_cast<std::size_t>(static_cast<const char*>(lookup) - static_cast<const char*>(info.dli_fbase)));
    text = text.empty() ? module + buf : text + " (" + module + buf + ")";
  } else {
    std::snprintf(buf, sizeof buf, "%p", address);
    text = buf;
  }
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(address, text);
  return text;
}

const std::vector<std::string>& default_internal_prefixes() {
  static const std::vector<std::string> p = {
      "tandem::memory::", "c10::", "at::", "torch::", "caffe2::", "std::", "__gnu_cxx::",
      "void std::", "libc10", "libtorch", "libtandem", "libc.so", "libstdc++", "__libc", "_start", "backtrace"};
  return p;
}

bool is_internal_frame(const std::string& s, const std::vector<std::string>& prefixes) {
  // The symbol, with a leading return type ("at::Tensor foo(...)") removed when present.
  const auto paren = s.find(" (");
  const std::string sym = s.substr(0, paren);
  std::string module;
  if (paren != std::string::npos) module = s.substr(paren + 2);
  else if (s.find('(') == std::string::npos) module = s;  // "module+0x..." only
  std::string name = sym;
  const auto templ = sym.find('<');
  const auto space = sym.find(' ');
  if (space != std::string::npos && (templ == std::string::npos || space < templ)) name = sym.substr(space + 1);
  for (const auto& p : prefixes) {
    if (sym.compare(0, p.size(), p) == 0 || name.compare(0, p.size(), p) == 0) return true;
    if (!module.empty() && module.compare(0, p.size(), p) == 0) return true;
  }
  return false;
}

}  // namespace tandem::memory
