// The one source of tandem_bench_torch (bench/CMakeLists.txt), whose precompiled <torch/torch.h>
// every libtorch bench reuses.
