#include "checkpoint/checkpoint_file_system.h"

#include <tandem/base/errors.h>

#include <string>
#include <utility>
#include <vector>

namespace tandem::detail {
namespace {

// Runs `op`, turning a file system's FileError into the checkpoint layer's CheckpointError.
template <class Op>
auto as_checkpoint_error(Op&& op) -> decltype(op()) {
  try {
    return op();
  } catch (const CrashError&) {
    throw;
  } catch (const CheckpointError&) {
    throw;
  } catch (const FileError& e) {
    throw CheckpointError(e.what(), e.restartable());
  }
}

class WritableView final : public WritableFile {
 public:
  explicit WritableView(std::unique_ptr<WritableFile> f) : f_(std::move(f)) {}
  void append(const void* data, size_t n) override {
    as_checkpoint_error([&] { f_->append(data, n); });
  }
  void sync() override { as_checkpoint_error([&] { f_->sync(); }); }
  void close() override { as_checkpoint_error([&] { f_->close(); }); }

 private:
  std::unique_ptr<WritableFile> f_;
};

class ReadableView final : public ReadableFile {
 public:
  explicit ReadableView(std::unique_ptr<ReadableFile> f) : f_(std::move(f)) {}
  uint64_t size() const override { return as_checkpoint_error([&] { return f_->size(); }); }
  void read(uint64_t offset, size_t n, void* dst) override {
    as_checkpoint_error([&] { f_->read(offset, n, dst); });
  }

 private:
  std::unique_ptr<ReadableFile> f_;
};

class CheckpointFileSystem final : public FileSystem {
 public:
  explicit CheckpointFileSystem(std::shared_ptr<FileSystem> fs) : fs_(std::move(fs)) {}
  std::unique_ptr<WritableFile> new_writable_file(const std::string& path) override {
    return std::make_unique<WritableView>(as_checkpoint_error([&] { return fs_->new_writable_file(path); }));
  }
  std::unique_ptr<ReadableFile> open_readable(const std::string& path) override {
    return std::make_unique<ReadableView>(as_checkpoint_error([&] { return fs_->open_readable(path); }));
  }
  void rename(const std::string& from, const std::string& to) override {
    as_checkpoint_error([&] { fs_->rename(from, to); });
  }
  void sync_dir(const std::string& path) override { as_checkpoint_error([&] { fs_->sync_dir(path); }); }
  void create_dirs(const std::string& path) override {
    as_checkpoint_error([&] { fs_->create_dirs(path); });
  }
  std::vector<std::string> list_dir(const std::string& path) override {
    return as_checkpoint_error([&] { return fs_->list_dir(path); });
  }
  bool exists(const std::string& path) override {
    return as_checkpoint_error([&] { return fs_->exists(path); });
  }
  bool is_directory(const std::string& path) override {
    return as_checkpoint_error([&] { return fs_->is_directory(path); });
  }
  void remove_file(const std::string& path) override {
    as_checkpoint_error([&] { fs_->remove_file(path); });
  }
  void remove_dir(const std::string& path) override {
    as_checkpoint_error([&] { fs_->remove_dir(path); });
  }

 private:
  std::shared_ptr<FileSystem> fs_;
};

}  // namespace

std::shared_ptr<FileSystem> checkpoint_file_system(std::shared_ptr<FileSystem> fs) {
  if (!fs) fs = posix_file_system();
  if (std::dynamic_pointer_cast<CheckpointFileSystem>(fs)) return fs;
  return std::make_shared<CheckpointFileSystem>(std::move(fs));
}

}  // namespace tandem::detail
