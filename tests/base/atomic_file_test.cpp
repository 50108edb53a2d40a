#include <tandem/base/file_system.h>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

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

// The pid of a process that has exited (and was reaped).
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

TEST(AtomicFileWrite, AbandonedTemporariesOfAKilledWriterAreRemovedAndALiveWritersKept) {
  auto fs = posix_file_system();
  const std::string dir = temp_dir();
  const std::string path = join_path(dir, "model.safetensors");
  const std::string abandoned = path + ".tmp." + std::to_string(dead_pid()) + ".0";
  const std::string live = path + ".tmp." + std::to_string(::getpid()) + ".7";
  for (const auto& p : {abandoned, live, path + ".tmp.notapid.0", join_path(dir, "other.tmp.1.0")}) {
    fs->write_file_atomically(p, "partial");
  }
  EXPECT_EQ(fs->remove_abandoned_temporaries(path), 1);
  EXPECT_FALSE(fs->exists(abandoned));
  EXPECT_TRUE(fs->exists(live)) << "a live writer's temporary file was removed";
  EXPECT_TRUE(fs->exists(path + ".tmp.notapid.0"));
  EXPECT_TRUE(fs->exists(join_path(dir, "other.tmp.1.0")));
  EXPECT_NE(FileSystem::temporary_path(path), FileSystem::temporary_path(path));
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
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find(blocked), std::string::npos) << e.what();
  }
  EXPECT_EQ(fs->read_file(path), "old");
  auto names = fs->list_dir(dir);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"blocked", "out.json"}));
  EXPECT_THROW(fs->write_file_atomically("/proc/self/no/such/dir/x", "y"), FileError);
  fs->remove_all(dir);
}

}  // namespace
}  // namespace tandem
