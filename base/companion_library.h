// Internal: opens one of tandem's own libraries (libtandem_cuda.so, libtandem_gloo.so) from the
// directory of the library that holds this code, libtandem.so: the build tree and an install
// prefix keep them together. Falls back to the loader's search path. Thread-safe (dlopen is).
#pragma once

#include <string>

namespace tandem {

// dlopen(3) of `file_name` with `flags`; nullptr with the loader's reason in *error on failure.
void* open_companion_library(const std::string& file_name, int flags, std::string* error);

}  // namespace tandem
