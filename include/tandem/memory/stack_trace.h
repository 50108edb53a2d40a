// Stack capture and symbolisation for allocation sites (libc backtrace + dladdr; no DWARF).
//
// Ownership: returns values; symbolize() keeps a process-wide cache of the strings it made.
// Thread-safety: every function may be called from any thread.
// Errors: none; an address that cannot be symbolised is printed as a number.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::memory {

// Writes up to `max_frames` return addresses of the calling thread into `out`, innermost first,
// after dropping `skip` innermost frames (this function's own frame is always dropped).
// Returns how many were written. Thread-safe; async-signal-unsafe (the unwinder may lock).
// Cost grows with depth: about 1 us per 10-20 frames (docs/memory.md has measurements).
std::size_t capture_stack(void** out, std::size_t max_frames, std::size_t skip);

// Hash of a captured stack (identifies an allocation site).
std::uint64_t hash_stack(void* const* frames, std::size_t n);

// "function+0x1a (module+0x1234)": demangled name from the dynamic symbol table and the offset
// of the address in its module, which `addr2line -e module 0x1234` turns into file:line.
// Functions of an executable are found only when it is linked with -rdynamic (CMake:
// ENABLE_EXPORTS ON); static functions show as "module+0x...". Results are cached. Thread-safe.
std::string symbolize(const void* address);

// True when the symbolised frame belongs to the allocator or the tensor library rather than to
// user code: its text starts with one of `prefixes` (after an optional return type) or its
// module file name starts with one of them.
bool is_internal_frame(const std::string& symbolised, const std::vector<std::string>& prefixes);

// Prefixes treated as internal by default: tandem (tandem::memory, libtandem), libc10/ATen/torch/caffe2,
// the C++ standard library and libc.
const std::vector<std::string>& default_internal_prefixes();

}  // namespace tandem::memory
