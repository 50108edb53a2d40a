#include "collectives/gloo/gloo_library.h"

#include "base/companion_library.h"

#include <tandem/base/errors.h>

#include <dlfcn.h>

namespace tandem::detail {
namespace {

struct GlooLibrary {
  GlooOpenDeviceFn open_device = nullptr;
  std::string error;
};

GlooLibrary load() {
  GlooLibrary lib;
  // RTLD_LOCAL keeps this Gloo out of the global scope, where libtorch_cpu's own calls into its
  // Gloo would find it; RTLD_DEEPBIND makes the library and its libgloo look in themselves
  // first, where the global scope would hand them libtorch_cpu's Gloo.
  void* handle = open_companion_library(TANDEM_GLOO_LIBRARY,
                                        RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND, &lib.error);
  if (handle == nullptr) {
    lib.error += " (it is built and installed beside libtandem.so; Debian's libgloo0 must be "
                 "installed: scripts/install-deps)";
    return lib;
  }
  lib.open_device = reinterpret_cast<GlooOpenDeviceFn>(::dlsym(handle, kGlooOpenDeviceSymbol));
  if (lib.open_device == nullptr) {
    lib.error = std::string(TANDEM_GLOO_LIBRARY) + " has no " + kGlooOpenDeviceSymbol +
                ": it belongs to another build of tandem";
  }
  return lib;
}

}  // namespace

std::shared_ptr<GlooDevice> open_gloo_device(const std::string& interface,
                                             const std::string& hostname) {
  static const GlooLibrary lib = load();
  if (lib.open_device == nullptr) throw CommError("tandem: Gloo is unavailable: " + lib.error);
  try {
    return lib.open_device(interface, hostname);
  } catch (const std::exception& e) {
    throw CommError("tandem: cannot open a TCP device on " +
                    (interface.empty() ? "host '" + hostname + "'"
                                       : "interface '" + interface + "'") +
                    ": " + e.what() + ". Set GlooOptions::hostname/interface to an address of "
                    "this machine that the other ranks can reach.");
  }
}

}  // namespace tandem::detail
