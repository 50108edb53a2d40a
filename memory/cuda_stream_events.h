// Internal (libtandem_cuda): StreamEvents over CUDA events, for the CrossStreamResource of a
// device's stack.
#pragma once

#include <memory>

#include <tandem/memory/cross_stream_resource.h>

namespace tandem::memory {

// Events of `device` (created there, timing disabled, recycled). A StreamId is a cudaStream_t.
// Thread-safe, never throws: a failed record waits for the stream instead; a failed query or
// wait is reported on stderr and counts as done.
std::shared_ptr<StreamEvents> make_cuda_stream_events(int device);

}  // namespace tandem::memory
