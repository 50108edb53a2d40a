#include <tandem/base/file_system.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace tandem {
namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/tandem-atomic-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d;
}

TEST(AtomicFileWrite, ReplacesTheFileAndLeavesNoTemporary) {
  auto fs = posix_file_system();
  const std::string dir = temp_dir();
  const std::string path = join_path(dir, "out.json");
  fs->write_file_atomically(path, "first");
  EXPECT_EQ(fs->read_file(path), "first");
  fs->write_file_atomically(path, std::string(1 << 20, 'x'));
  EXPECT_EQ(fs->read_file(path), std::string(1 << 20, 'x'));
  EXPECT_EQ(fs->list_dir(dir), std::vector<std::string>{"out.json"});
  fs->remove_all(dir);
}

TEST(AtomicFileWrite, AFailedWriteLeavesTheOldFileAndNamesThePath) {
  auto fs = posix_file_system();
  const std::string dir = temp_dir();
  const std::string path = join_path(dir, "out.json");
  fs->write_file_atomically(path, "old");
  // Renaming a file over a directory fails: the old contents must stay, the temporary must go.
  const std::string blocked = join_path(dir, "blocked");
  fs->create_dirs(join_path(blocked, "inside"));
  try {
    fs->write_file_atomically(blocked, "new");
    FAIL() << "writing over a non-empty directory succeeded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(blocked), std::string::npos) << e.what();
  }
  EXPECT_EQ(fs->read_file(path), "old");
  auto names = fs->list_dir(dir);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"blocked", "out.json"}));
  EXPECT_THROW(fs->write_file_atomically("/proc/self/no/such/dir/x", "y"), CheckpointError);
  fs->remove_all(dir);
}

}  // namespace
}  // namespace tandem
