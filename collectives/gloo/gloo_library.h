// Internal: libtandem's way into its private Gloo (gloo_mesh.h says why Gloo lives apart).
#pragma once

#include "collectives/gloo/gloo_mesh.h"

namespace tandem::detail {

// A TCP device from libtandem_gloo.so, loaded once (RTLD_LOCAL | RTLD_DEEPBIND) beside
// libtandem.so. Throws CommError when that library cannot be loaded, or when no address of this
// machine matches `interface` / `hostname` (the message says which option to change).
std::shared_ptr<GlooDevice> open_gloo_device(const std::string& interface,
                                             const std::string& hostname);

}  // namespace tandem::detail
