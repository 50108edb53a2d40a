// Single safetensors files: a model exported for inference (ShardedDataParallel's consolidated
// export), read back with its checksums verified.
//
// The file is one shard of tandem's checkpoint format (docs/checkpoints.md: an 8-byte header
// length, a JSON header whose "__metadata__" holds each tensor's XXH3-64, then the raw
// little-endian bytes), so any safetensors reader loads it and tools/checkpoint_reader.py verifies
// it. The writer streams: the header is written from the tensors' names, dtypes, shapes and
// checksums, then each tensor's bytes in order, so the whole set never has to be in memory; the
// file appears under its name only once complete (temporary name, fsync, rename, fsync of the
// directory).
// Ownership: the writer owns its open file until commit() or destruction (which removes an
// uncommitted file). Thread-safety: one thread per writer; readers are reentrant.
// Errors: CheckpointError naming the file and what is wrong (I/O errors, a tensor out of order or
// of another shape or dtype, a checksum mismatch, a module tensor missing from the file).
#pragma once

#include <tandem/base/file_system.h>
#include <tandem/checkpoint/format.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

class SafetensorsWriter {
 public:
  // `records`: every tensor's name, dtype, shape and xxh3 (XXH3-64 of its bytes), in file order.
  SafetensorsWriter(std::shared_ptr<FileSystem> fs, std::string path,
                    std::vector<TensorRecord> records,
                    std::map<std::string, CheckpointValue> values = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends the next tensor (contiguous host copy made if needed); its dtype, shape and checksum
  // must match its record.
  void write(const at::Tensor& tensor);
  // After the last tensor: fsync, rename into place, fsync the directory.
  void commit();

 private:
  std::shared_ptr<FileSystem> fs_;
  std::string path_, tmp_;
  std::vector<TensorRecord> records_;
  size_t next_ = 0;
  std::unique_ptr<WritableFile> file_;
  bool committed_ = false;
};

// Every tensor of a safetensors file written by tandem, checksums verified, as host tensors.
std::vector<std::pair<std::string, at::Tensor>> read_safetensors(
    const std::string& path, std::shared_ptr<FileSystem> fs = nullptr);

// Copies the file's tensors into `module`'s parameters and buffers of the same names (no grad);
// every parameter and buffer must be in the file with its shape and dtype.
void load_safetensors(torch::nn::Module& module, const std::string& path,
                      std::shared_ptr<FileSystem> fs = nullptr);

}  // namespace tandem
