// libtandem_gloo.so: tandem's private Gloo (gloo_mesh.h says why it is a library of its own).
// Links libgloo and nothing of torch or tandem; its one exported entry is
// tandem_gloo_open_device().
#include "collectives/gloo/gloo_mesh.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <gloo/common/error.h>

#include <stdexcept>
#include <system_error>
#include <type_traits>

namespace tandem::detail {
namespace {

// Gloo's typed setters only use sizeof(T): pick an unsigned type of the element's width.
template <class Setter>
void with_element_type(size_t element_size, Setter&& set) {
  switch (element_size) {
    case 1: set(static_cast<uint8_t*>(nullptr)); break;
    case 2: set(static_cast<uint16_t*>(nullptr)); break;
    case 4: set(static_cast<uint32_t*>(nullptr)); break;
    case 8: set(static_cast<uint64_t*>(nullptr)); break;
    default: throw std::invalid_argument("unsupported element size " + std::to_string(element_size));
  }
}

// Runs a Gloo call; its I/O errors leave as std::system_error (gloo_mesh.h). Gloo has one
// exception type for both of them, so its message tells a timeout ("Timed out waiting ...",
// "Connect timeout ...") from a lost peer: here, once, and libtandem decides by the code.
template <class F>
auto io(F&& call) {
  try {
    return call();
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    const bool timed_out =
        what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
    throw std::system_error(
        std::make_error_code(timed_out ? std::errc::timed_out : std::errc::connection_reset), what);
  }
}

class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(GlooKeyValue& store, std::chrono::milliseconds timeout)
      : store_(store), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return store_.get(key); }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  GlooKeyValue& store_;
  std::chrono::milliseconds timeout_;
};

class Buffer final : public GlooBuffer {
 public:
  explicit Buffer(std::unique_ptr<gloo::transport::UnboundBuffer> buffer)
      : buffer_(std::move(buffer)) {}
  void send(int peer, uint64_t slot, size_t offset, size_t nbytes) override {
    io([&] { buffer_->send(peer, slot, offset, nbytes); });
  }
  void recv(int peer, uint64_t slot, size_t offset, size_t nbytes) override {
    io([&] { buffer_->recv(peer, slot, offset, nbytes); });
  }
  bool wait_send(std::chrono::milliseconds timeout) override {
    return io([&] { return buffer_->waitSend(timeout); });
  }
  bool wait_recv(std::chrono::milliseconds timeout) override {
    return io([&] { return buffer_->waitRecv(timeout); });
  }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
};

class Mesh final : public GlooMesh {
 public:
  explicit Mesh(std::shared_ptr<gloo::rendezvous::Context> context)
      : context_(std::move(context)) {}

  void allreduce(void* data, size_t count, size_t element_size, GlooReduceFn fn, bool bcube,
                 uint32_t tag, std::chrono::milliseconds timeout) override {
    gloo::AllreduceOptions opts(context_);
    with_element_type(element_size, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      opts.setOutput<T>(static_cast<T*>(data), count);
    });
    opts.setReduceFunction(fn);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    opts.setAlgorithm(bcube ? gloo::AllreduceOptions::Algorithm::BCUBE
                            : gloo::AllreduceOptions::Algorithm::RING);
    io([&] { gloo::allreduce(opts); });
  }

  void broadcast(void* data, size_t nbytes, int root, uint32_t tag,
                 std::chrono::milliseconds timeout) override {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(data), nbytes);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    io([&] { gloo::broadcast(opts); });
  }

  void allgather(const void* in, void* out, size_t nbytes, uint32_t tag,
                 std::chrono::milliseconds timeout) override {
    gloo::AllgatherOptions opts(context_);
    opts.setInput<uint8_t>(static_cast<uint8_t*>(const_cast<void*>(in)), nbytes);
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(out), nbytes * context_->size);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    io([&] { gloo::allgather(opts); });
  }

  void barrier(uint32_t tag, std::chrono::milliseconds timeout) override {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    io([&] { gloo::barrier(opts); });
  }

  std::unique_ptr<GlooBuffer> buffer(void* data, size_t nbytes) override {
    return std::make_unique<Buffer>(context_->createUnboundBuffer(data, nbytes));
  }

  void close() override {
    for (int i = 0; i < context_->size; ++i) {
      if (i == context_->rank) continue;
      try {
        auto& pair = context_->getPair(i);
        if (pair) pair->close();
      } catch (const std::exception&) {
        // Best effort: a pair that failed is closed already.
      }
    }
  }

 private:
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

class Device final : public GlooDevice {
 public:
  explicit Device(std::shared_ptr<gloo::transport::Device> device) : device_(std::move(device)) {}

  std::unique_ptr<GlooMesh> connect(GlooKeyValue& store, int rank, int size,
                                    std::chrono::milliseconds timeout) override {
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    StoreAdapter adapter(store, timeout);
    io([&] { context->connectFullMesh(adapter, device_); });
    return std::make_unique<Mesh>(std::move(context));
  }

 private:
  std::shared_ptr<gloo::transport::Device> device_;  // non-const: Gloo takes it by reference
};

}  // namespace
}  // namespace tandem::detail

extern "C" __attribute__((visibility("default"))) std::shared_ptr<tandem::detail::GlooDevice>
tandem_gloo_open_device(const std::string& interface, const std::string& hostname) {
  gloo::transport::tcp::attr attr;
  if (!interface.empty()) {
    attr.iface = interface;
  } else {
    attr.hostname = hostname;
  }
  return std::make_shared<tandem::detail::Device>(gloo::transport::tcp::CreateDevice(attr));
}

// The entry's type is the one gloo_library.cpp casts dlsym's answer to.
static_assert(std::is_same_v<decltype(&tandem_gloo_open_device), tandem::detail::GlooOpenDeviceFn>);
