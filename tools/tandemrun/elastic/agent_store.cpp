#include "tools/tandemrun/elastic/agent_store.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/tandemrun/elastic/rendezvous_store.h"

namespace tandem::launcher {
namespace {

constexpr const char* kModuleName = "libtandemrun_c10d.so";

// The directory of the running tandemrun (the module is found relative to it).
std::string executable_dir() {
  char path[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return ".";
  std::string dir(path, static_cast<std::size_t>(n));
  return dir.substr(0, dir.rfind('/'));
}

// Loaded once per process and never unloaded (the store's threads run its code).
ConnectStoreFn load_module() {
  static ConnectStoreFn connect = [] {
    const std::string dir = executable_dir();
    // Installed (bin/ -> lib/tandem/) and in the build tree (bin/ -> lib/tandem/); relative paths
    // are decided by CMake (tools/tandemrun/CMakeLists.txt).
    std::vector<std::string> candidates{dir + "/" TANDEMRUN_C10D_INSTALL_REL "/" + kModuleName,
                                        dir + "/" TANDEMRUN_C10D_BUILD_REL "/" + kModuleName};
    std::string errors;
    for (const auto& path : candidates) {
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        errors += std::string(errors.empty() ? "" : "; ") + ::dlerror();
        continue;
      }
      if (void* symbol = ::dlsym(handle, kConnectStoreSymbol))
        return reinterpret_cast<ConnectStoreFn>(symbol);
      errors += "; " + path + " has no " + kConnectStoreSymbol;
    }
    throw RendezvousError("a multi-node or --ft run needs tandemrun's store module " +
                          std::string(kModuleName) + " (it brings libtorch's c10d TCPStore), "
                          "which could not be loaded (" + errors +
                          "); reinstall tandem, keeping bin/ and lib/tandem/ together");
  }();
  return connect;
}

}  // namespace

std::unique_ptr<StoreConnection> connect_store(const StoreAddress& address) {
  const ConnectStoreFn connect = load_module();
  char error[2048] = {};
  StoreConnection* store = connect(address.host.c_str(), address.port, address.server ? 1 : 0,
                                   static_cast<long long>(address.timeout.count()), error,
                                   sizeof error);
  if (store == nullptr) throw std::runtime_error(error);
  return std::unique_ptr<StoreConnection>(store);
}

}  // namespace tandem::launcher
