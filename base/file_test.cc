#include "longhaul/base/file.h"

#include <filesystem>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/testing/temp_dir.h"

namespace longhaul::file {
namespace {

namespace fs = std::filesystem;

class FileTest : public ::testing::Test {
 protected:
  longhaul::testing::TempDir tmp_{"longhaul_file_test"};
  const fs::path dir_ = tmp_.path();
};

TEST_F(FileTest, CommitReplacesWholeFile) {
  write_atomically(dir_ / "state", "old contents");
  write_atomically(dir_ / "state", "new");
  EXPECT_EQ(read_file(dir_ / "state"), "new");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(FileTest, AbandonedWriteLeavesPreviousFileAndNoTemporary) {
  write_atomically(dir_ / "state", "good");
  {
    AtomicFile f(dir_ / "state");
    f.write(std::string(3 << 20, 'x'));  // larger than the buffer: reaches the disk
    // destroyed without commit, as when an exception unwinds a checkpoint write
  }
  EXPECT_EQ(read_file(dir_ / "state"), "good");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

// A file larger than a few writeback chunks, written in pieces that take both the buffered and
// the direct path, with its first bytes rewritten at the end (as a checkpoint's header is),
// reads back exactly; the chunks dropped from the page cache are on disk.
TEST_F(FileTest, LargeFileInMixedPiecesWithRewrittenHeaderReadsBackExactly) {
  std::string expected;
  {
    AtomicFile f(dir_ / "big");
    f.write(std::string(100, 'h'));  // a header placeholder
    expected += std::string(100, 'H');
    for (size_t i = 0; expected.size() < (100u << 20); ++i) {
      const size_t n = i % 3 == 0 ? 1000 + i : (1u << 20) + i;  // buffered / direct
      std::string piece(n, static_cast<char>('a' + i % 26));
      f.write(piece);
      expected += piece;
    }
    f.overwrite(0, std::string(100, 'H'));
    EXPECT_EQ(f.bytes_written(), expected.size());
    f.commit();
  }
  EXPECT_TRUE(read_file(dir_ / "big", expected.size()) == expected);
}

TEST_F(FileTest, OverwritePastWhatWasWrittenIsInvalidArgument) {
  AtomicFile f(dir_ / "state");
  f.write("0123456789");
  EXPECT_THROW(f.overwrite(5, "abcdef"), InvalidArgument);
  f.overwrite(4, "abcdef");
  f.commit();
  EXPECT_EQ(read_file(dir_ / "state"), "0123abcdef");
}

TEST_F(FileTest, MissingFileIsNotFoundNamingThePath) {
  try {
    read_file(dir_ / "nope");
    FAIL() << "expected NotFound";
  } catch (const NotFound& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
}

TEST_F(FileTest, UnwritableDirectoryIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root can write anywhere; permission bits do not apply";
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_THROW(ensure_writable_directory(dir_, "logdir"), PermissionDenied);
}

TEST_F(FileTest, UncreatableDirectoryIsPermissionDenied) {
  write_atomically(dir_ / "afile", "x");
  // A path below a regular file can never be created, even by root.
  try {
    ensure_writable_directory(dir_ / "afile" / "logdir", "logdir");
    FAIL() << "expected PermissionDenied";
  } catch (const PermissionDenied& e) {
    EXPECT_NE(std::string(e.what()).find("afile/logdir"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace longhaul::file
