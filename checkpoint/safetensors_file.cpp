#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/checkpoint/safetensors.h>

#include "checkpoint/checkpoint_file_system.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <ATen/ops/empty.h>

#include <cstring>
#include <map>

namespace tandem {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw CheckpointError("tandem: safetensors: '" + path + "': " + what);
}

uint64_t tensor_hash(const at::Tensor& t) { return xxh3_64(t.data_ptr(), t.nbytes()); }

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::shared_ptr<FileSystem> fs, std::string path,
                                     std::vector<TensorRecord> records,
                                     std::map<std::string, CheckpointValue> values)
    : fs_(detail::checkpoint_file_system(std::move(fs))), path_(std::move(path)), records_(std::move(records)) {
  // A writer SIGKILLed mid-export left its temporary file: the next export clears it.
  fs_->remove_abandoned_temporaries(path_);
  tmp_ = FileSystem::temporary_path(path_);
  ShardHeader header;
  header.tensors = records_;
  header.values = std::move(values);
  const std::string head = encode_shard_header(&header, /*assign_offsets=*/true);
  records_ = header.tensors;
  const std::string parent = parent_path(path_);
  if (!parent.empty()) fs_->create_dirs(parent);
  file_ = fs_->new_writable_file(tmp_);
  file_->append(head.data(), head.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (committed_) return;
  try {
    file_.reset();
    if (fs_->exists(tmp_)) fs_->remove_file(tmp_);
  } catch (const CheckpointError&) {  // nothing better to do in a destructor
  }
}

void SafetensorsWriter::write(const at::Tensor& tensor) {
  if (next_ >= records_.size()) fail(path_, "more tensors written than the header lists");
  const TensorRecord& r = records_[next_];
  const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
  if (to_checkpoint_dtype(t.scalar_type()) != r.dtype || t.sizes().vec() != r.shape) {
    fail(path_, "tensor \"" + r.name + "\" is " + std::string(c10::toString(t.scalar_type())) + " " +
                    c10::str(t.sizes()) + ", its record says " + dtype_name(r.dtype) + " " +
                    c10::str(at::IntArrayRef(r.shape)));
  }
  if (tensor_hash(t) != r.xxh3) {
    fail(path_, "tensor \"" + r.name + "\" changed between hashing and writing (checksum " +
                    hash_hex(tensor_hash(t)) + ", record " + hash_hex(r.xxh3) + ")");
  }
  file_->append(t.data_ptr(), t.nbytes());
  ++next_;
}

void SafetensorsWriter::commit() {
  if (next_ != records_.size()) {
    fail(path_, std::to_string(records_.size() - next_) + " of " + std::to_string(records_.size()) +
                    " tensors were never written");
  }
  file_->sync();
  file_->close();
  fs_->rename(tmp_, path_);
  fs_->sync_dir(parent_path(path_));
  committed_ = true;
}

std::vector<std::pair<std::string, at::Tensor>> read_safetensors(const std::string& path,
                                                                 std::shared_ptr<FileSystem> fs) {
  fs = detail::checkpoint_file_system(std::move(fs));
  auto f = fs->open_readable(path);
  unsigned char prefix[8];
  if (f->size() < 8) fail(path, "shorter than a header (" + std::to_string(f->size()) + " bytes)");
  f->read(0, 8, prefix);
  uint64_t len = 0;
  try {
    len = decode_shard_header_length(prefix, f->size());
  } catch (const CheckpointError& e) {
    fail(path, std::string(e.what()).substr(std::strlen("tandem: checkpoint: ")));
  }
  std::string json(static_cast<size_t>(len), '\0');
  if (len > 0) f->read(8, json.size(), json.data());
  ShardHeader h;
  try {
    h = parse_shard_header(json, f->size());
  } catch (const CheckpointError& e) {
    fail(path, e.what());
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& r : h.tensors) {
    at::Tensor t = at::empty(r.shape, at::TensorOptions().dtype(to_scalar_type(r.dtype)));
    if (r.nbytes() > 0) f->read(8 + len + r.begin, static_cast<size_t>(r.nbytes()), t.data_ptr());
    if (tensor_hash(t) != r.xxh3) {
      fail(path, "tensor \"" + r.name + "\" checksum mismatch (stored " + hash_hex(r.xxh3) +
                     ", computed " + hash_hex(tensor_hash(t)) + ")");
    }
    out.emplace_back(r.name, std::move(t));
  }
  return out;
}

void load_safetensors(torch::nn::Module& module, const std::string& path,
                      std::shared_ptr<FileSystem> fs) {
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, t] : read_safetensors(path, std::move(fs))) tensors.emplace(name, std::move(t));
  torch::autograd::AutoGradMode no_grad(false);
  auto copy_into = [&](const std::string& name, at::Tensor& target) {
    auto it = tensors.find(name);
    if (it == tensors.end()) fail(path, "has no tensor \"" + name + "\" for the module");
    if (it->second.sizes() != target.sizes() || it->second.scalar_type() != target.scalar_type()) {
      fail(path, "tensor \"" + name + "\" is " + std::string(c10::toString(it->second.scalar_type())) +
                     " " + c10::str(it->second.sizes()) + ", the module's is " +
                     std::string(c10::toString(target.scalar_type())) + " " + c10::str(target.sizes()));
    }
    target.copy_(it->second);
  };
  for (auto& p : module.named_parameters()) copy_into(p.key(), p.value());
  for (auto& b : module.named_buffers()) copy_into(b.key(), b.value());
}

}  // namespace tandem
