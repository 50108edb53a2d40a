#include "base/companion_library.h"

#include <dlfcn.h>

namespace tandem {

void* open_companion_library(const std::string& file_name, int flags, std::string* error) {
  std::string candidates[2] = {"", file_name};
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&open_companion_library), &self) != 0 && self.dli_fname) {
    const std::string path = self.dli_fname;
    const auto slash = path.rfind('/');
    if (slash != std::string::npos) candidates[0] = path.substr(0, slash + 1) + file_name;
  }
  std::string why;
  for (const std::string& candidate : candidates) {
    if (candidate.empty()) continue;
    if (void* handle = ::dlopen(candidate.c_str(), flags)) return handle;
    const char* reason = ::dlerror();
    // The first failure says more (a missing dependency) than "not found in the search path".
    if (why.empty() && reason != nullptr) why = reason;
  }
  if (error != nullptr) *error = "cannot load " + file_name + ": " + why;
  return nullptr;
}

}  // namespace tandem
