// The checkpoint layer's view of a FileSystem: the same files, with every FileError the file
// system throws handed on as a CheckpointError (same message, same restartable flag), so that the
// checkpoint API keeps its one error type (checkpoint_manager.h, safetensors.h) while base/ speaks
// of files only. A CrashError (tests' simulated crash) passes unchanged.
// Ownership: the view shares the file system it wraps. Thread-safety: that of the wrapped one.
// Errors: CheckpointError, or CrashError.
#pragma once

#include <tandem/base/file_system.h>

#include <memory>

namespace tandem::detail {

// `fs` seen through the checkpoint layer (null: posix_file_system()); a view is returned as is.
std::shared_ptr<FileSystem> checkpoint_file_system(std::shared_ptr<FileSystem> fs);

}  // namespace tandem::detail
