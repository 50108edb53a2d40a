# Sources of tandem_memory_core (no torch). Included by memory/CMakeLists.txt and by the standalone
# sanitizer project in tests/memory/sanitizers.
set(TANDEM_MEMORY_CORE_SOURCE_NAMES
  memory_resource.cpp memory_stats.cpp host_backend.cpp caching_pool.cpp caching_pool_options.cpp
  thread_cache.cpp
  statistics_resource.cpp limiting_resource.cpp stack_trace.cpp tracking_resource.cpp
  leak_detector.cpp snapshot.cpp memory_stack.cpp host_memory_stack.cpp cross_stream_resource.cpp)
set(TANDEM_MEMORY_CORE_SOURCES)
foreach(f ${TANDEM_MEMORY_CORE_SOURCE_NAMES})
  list(APPEND TANDEM_MEMORY_CORE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/${f})
endforeach()
