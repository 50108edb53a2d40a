// Internal: opens one of tandem's own libraries (libtandem_cuda.so, libtandem_gloo.so) from the
// directory of the library that holds this code, libtandem.so: the build tree and an install
// prefix keep them together. Falls back to the loader's search path. Thread-safe (dlopen and a
// function-local static).
#pragma once

#include <string>

namespace tandem {

// dlopen(3) of `file_name` with `flags`; nullptr with the loader's reason in *error on failure.
void* open_companion_library(const std::string& file_name, int flags, std::string* error);

// `symbol` of libtandem_cuda.so, opened once (RTLD_GLOBAL) on first use: the one way libtandem
// reaches its CUDA part. nullptr, with why in *why (when given), where the build has no CUDA
// part, the library or its CUDA runtime cannot be loaded, or it lacks the symbol.
void* cuda_companion_symbol(const char* symbol, std::string* why);

}  // namespace tandem
