// Internal: the seam between libtandem.so and its private Gloo.
//
// The torch wheel's libtorch_cpu.so exports a Gloo of its own (575 symbols, no headers), and its
// calls into it are resolved at load time like any other symbol's. A second exported Gloo in the
// process binds each caller to whichever copy the dynamic linker meets first, so code compiled
// against one copy runs on the other's layout (SIGSEGV). tandem's Gloo is therefore private:
// everything that touches Gloo's headers or symbols is in libtandem_gloo.so (gloo_mesh.cpp),
// which links libgloo and nothing of torch, and which libtandem loads with RTLD_LOCAL |
// RTLD_DEEPBIND (gloo_library.cpp). Its Gloo symbols then resolve inside itself and its libgloo,
// libtorch's inside libtorch_cpu, and neither copy is visible to the other.
//
// Only this header crosses the boundary: abstract classes (vtables, no symbols), std types of
// the one libstdc++ both sides share, and exceptions derived from std::exception. Gloo's I/O
// errors arrive as std::system_error with Gloo's message as what(), and a code that says which:
// std::errc::timed_out (a wait or a connect ran out of time) or std::errc::connection_reset (a
// peer closed or reset its connections). Other Gloo errors arrive as std::exception with Gloo's
// message; an exception thrown by a GlooKeyValue callback (tandem's TimeoutError) passes through
// unchanged.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::detail {

// What Gloo's rendezvous needs from a key-value store; libtandem implements it over c10d stores.
class GlooKeyValue {
 public:
  virtual ~GlooKeyValue() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  // Throws (tandem::TimeoutError) when a key has not appeared within `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

// out[i] = a[i] (op) b[i] for n elements; out may alias a or b.
using GlooReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// Memory the transport reads (send) or writes (recv) until the matching wait returns. The owner
// keeps the memory alive that long; destroying the buffer with an op outstanding is only safe
// after the mesh was closed.
class GlooBuffer {
 public:
  virtual ~GlooBuffer() = default;
  virtual void send(int peer, uint64_t slot, size_t offset, size_t nbytes) = 0;
  virtual void recv(int peer, uint64_t slot, size_t offset, size_t nbytes) = 0;
  // False when the buffer was aborted; throws on a timeout or a broken connection.
  virtual bool wait_send(std::chrono::milliseconds timeout) = 0;
  virtual bool wait_recv(std::chrono::milliseconds timeout) = 0;
};

// A connected full mesh of `size` ranks. Collectives are blocking and, like Gloo's, must be
// issued by one thread at a time in the same order on every rank; `tag` tells ops apart.
class GlooMesh {
 public:
  virtual ~GlooMesh() = default;
  // In place over `count` elements of `element_size` bytes; bcube below Gloo's ring sizes.
  virtual void allreduce(void* data, size_t count, size_t element_size, GlooReduceFn fn,
                         bool bcube, uint32_t tag, std::chrono::milliseconds timeout) = 0;
  virtual void broadcast(void* data, size_t nbytes, int root, uint32_t tag,
                         std::chrono::milliseconds timeout) = 0;
  // `out` holds size() * nbytes: rank r's `in` lands at r * nbytes.
  virtual void allgather(const void* in, void* out, size_t nbytes, uint32_t tag,
                         std::chrono::milliseconds timeout) = 0;
  virtual void barrier(uint32_t tag, std::chrono::milliseconds timeout) = 0;
  virtual std::unique_ptr<GlooBuffer> buffer(void* data, size_t nbytes) = 0;
  // Closes every connection (best effort): later ops fail at once, and so do ops blocked on a
  // peer whose socket then errors. An op waiting on a peer that went silent (a partition) still
  // waits out its timeout: Gloo's close() does not wake its buffers, and the call that would
  // (tcp::Pair::signalExceptionExternal) is in a header Debian's libgloo-dev cannot compile.
  virtual void close() = 0;
};

// A TCP device: one per process and address, shared by a communicator and its groups.
class GlooDevice {
 public:
  virtual ~GlooDevice() = default;
  // Rendezvous of `size` ranks through `store`; every op then times out after `timeout`.
  virtual std::unique_ptr<GlooMesh> connect(GlooKeyValue& store, int rank, int size,
                                            std::chrono::milliseconds timeout) = 0;
};

// Bound to `interface` when it is non-empty, else to the address of `hostname`.
// Throws std::exception with Gloo's reason when no such address exists here.
using GlooOpenDeviceFn = std::shared_ptr<GlooDevice> (*)(const std::string& interface,
                                                         const std::string& hostname);

// libtandem_gloo.so's one entry point, found with dlsym.
inline constexpr const char* kGlooOpenDeviceSymbol = "tandem_gloo_open_device";

}  // namespace tandem::detail
