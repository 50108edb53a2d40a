// Umbrella header of tandem's caching allocator (no torch headers; see docs/memory.md).
// Ownership: see each included header (this one declares nothing).
// Thread-safety: see each included header.
// Errors: see each included header.
#pragma once

#include <tandem/memory/caching_pool.h>
#include <tandem/memory/cpu_allocator.h>
#include <tandem/memory/cross_stream_resource.h>
#include <tandem/memory/cuda_allocator.h>
#include <tandem/memory/host_backend.h>
#include <tandem/memory/host_memory_stack.h>
#include <tandem/memory/leak_detector.h>
#include <tandem/memory/limiting_resource.h>
#include <tandem/memory/memory_resource.h>
#include <tandem/memory/memory_stack.h>
#include <tandem/memory/memory_stats.h>
#include <tandem/memory/snapshot.h>
#include <tandem/memory/stack_trace.h>
#include <tandem/memory/statistics_resource.h>
#include <tandem/memory/tracking_resource.h>
