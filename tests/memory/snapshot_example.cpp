// Writes a small but realistic snapshot JSON (for the renderer test and as an example of use):
// a few "training steps" with a planted leak, through the HostMemoryStack with tracking on.
#include <cstdio>
#include <vector>

#include <tandem/memory/host_memory_stack.h>
#include <tandem/memory/snapshot.h>

namespace tmem = tandem::memory;

__attribute__((noinline)) void* snapshot_example_keep(tmem::MemoryResource& r) { return r.allocate(96 << 10); }

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.json\n", argv[0]);
    return 2;
  }
  tmem::HostMemoryStackOptions o;
  o.tracking = true;
  o.tracking_options.stacks = tmem::StackCapture::kAll;
  o.tracking_options.report_at_exit = false;
  tmem::HostMemoryStack stack(o);
  std::vector<std::pair<void*, std::size_t>> kept;
  void* weights = stack.top().allocate(12 << 20);
  for (int step = 0; step < 12; ++step) {
    std::vector<std::pair<void*, std::size_t>> tmp;
    for (std::size_t i = 1; i <= 8; ++i) tmp.emplace_back(stack.top().allocate(i * 40000), i * 40000);
    kept.emplace_back(snapshot_example_keep(stack.top()), 96 << 10);
    for (std::size_t i = 0; i < tmp.size(); i += 2) stack.top().deallocate(tmp[i].first, tmp[i].second);
    for (std::size_t i = 1; i < tmp.size(); i += 2) {
      if (step == 11) continue;  // leave some live at the snapshot
      stack.top().deallocate(tmp[i].first, tmp[i].second);
    }
    if (step == 11) {
      tmem::write_snapshot_json(tmem::take_snapshot(stack.top()), argv[1]);
      for (std::size_t i = 1; i < tmp.size(); i += 2) stack.top().deallocate(tmp[i].first, tmp[i].second);
    }
    stack.tracking()->mark_step();
  }
  for (auto& [p, n] : kept) stack.top().deallocate(p, n);
  stack.top().deallocate(weights, 12 << 20);
  return 0;
}
