// The one source of tandem_torch_pch (the top-level CMakeLists.txt), whose precompiled
// <torch/torch.h> the examples and every libtorch bench reuse.
