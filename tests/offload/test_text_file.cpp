// write_text_file: a whole file or the earlier one unchanged, never a cut one.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "device/error.hpp"
#include "offload/text_file.hpp"

using spillway::io_error;
using spillway::offload::write_text_file;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("spillway-text-file-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

std::string contents(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::size_t files_in(const fs::path& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

}  // namespace

TEST(WriteTextFile, WritesTheWholeFileAndReplacesAnEarlierOne) {
  const auto p = scratch("report.json");
  write_text_file(p.string(), std::string(100000, 'a'), "the report");
  EXPECT_EQ(contents(p), std::string(100000, 'a'));
  write_text_file(p.string(), "short\n", "the report");
  EXPECT_EQ(contents(p), "short\n");
  EXPECT_EQ(files_in(p.parent_path()), 1u) << "no temporary file is left";
  fs::remove_all(p.parent_path());
}

TEST(WriteTextFile, AWriteThatFailsLeavesTheEarlierFileAndNoTemporary) {
  const auto p = scratch("trace.json");
  write_text_file(p.string(), "earlier\n", "the trace");
  // A file size limit makes the write fail part way, as a full disk would.
  struct sigaction ignore {}, before {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &before), 0);
  rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string why;
  try {
    write_text_file(p.string(), std::string(1 << 20, 'b'), "the trace");
  } catch (const io_error& e) {
    why = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::sigaction(SIGXFSZ, &before, nullptr);
  EXPECT_NE(why.find("cannot write the trace"), std::string::npos) << why;
  EXPECT_NE(why.find(p.string()), std::string::npos) << why;
  EXPECT_EQ(contents(p), "earlier\n");
  EXPECT_EQ(files_in(p.parent_path()), 1u);
  fs::remove_all(p.parent_path());
}

TEST(WriteTextFile, AMissingFolderOrAFolderAsTheFileIsAnError) {
  const auto dir = scratch("x").parent_path();
  EXPECT_THROW(write_text_file((dir / "no-such-folder" / "r.json").string(), "x", "the report"), io_error);
  try {
    write_text_file(dir.string(), "x", "the report");
    ADD_FAILURE() << "a folder was taken as the file";
  } catch (const io_error& e) {
    EXPECT_NE(std::string(e.what()).find("is a folder"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(WriteTextFile, ALinkIsFollowedAndStays) {
  const auto target = scratch("target.json");
  const auto link = scratch("link.json");
  write_text_file(target.string(), "old\n", "the report");
  fs::create_symlink(target, link);
  write_text_file(link.string(), "new\n", "the report");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(contents(target), "new\n");
  fs::remove_all(target.parent_path());
}

TEST(WriteTextFile, ADeviceThatIsFullIsAnError) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  EXPECT_THROW(write_text_file("/dev/full", "x", "the report"), io_error);
  EXPECT_TRUE(fs::is_character_file("/dev/full")) << "a device is written in place, never replaced";
}
