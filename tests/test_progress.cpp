// The progress bar: silent unless its stream is a terminal, rendered with a
// bar, counts, percentage and ETA on one, and its frame arithmetic.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "tools/progress.h"

namespace {

using kvs::tools::Progress;

std::string drain(int fd, int wait_ms = 200) {
  std::string out;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, wait_ms) > 0) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

TEST(Progress, RendersBarCountsAndEta) {
  EXPECT_EQ(Progress::render("load", 0, 4, 0, "", 8), "load [--------] 0/4   0%");
  EXPECT_EQ(Progress::render("load", 1, 4, 10, "", 8), "load [##------] 1/4  25%  ETA 30s");
  EXPECT_EQ(Progress::render("eval", 3, 4, 90, "PPL 5.1", 8), "eval [######--] 3/4  75%  ETA 30s  PPL 5.1");
  EXPECT_EQ(Progress::render("eval", 4, 4, 125, "", 8), "eval [########] 4/4 100%  2m05s");
  EXPECT_EQ(kvs::tools::format_duration(3725), "1h02m");
}

// Not a terminal (a pipe, as in CI): not one byte.
TEST(Progress, WritesNothingWhenNotATerminal) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  {
    Progress p("x", 3, fds[1], isatty(fds[1]) == 1);
    EXPECT_FALSE(p.enabled());
    for (int i = 0; i <= 3; ++i) p.update(i);
  }
  close(fds[1]);
  EXPECT_EQ(drain(fds[0]), "");
  close(fds[0]);
}

// A pseudo-terminal: the bar redraws in place and ends with a newline.
TEST(Progress, DrawsOnATerminal) {
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  const int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(slave, 0);
  {
    Progress p("repack", 2, slave, isatty(slave) == 1);
    EXPECT_TRUE(p.enabled());
    p.update(1);
    p.update(2, "done");
  }
  const std::string out = drain(master);
  EXPECT_NE(out.find("repack [###############---------------] 1/2  50%  ETA"), std::string::npos) << out;
  EXPECT_NE(out.find("2/2 100%"), std::string::npos) << out;
  EXPECT_NE(out.find("done"), std::string::npos) << out;
  EXPECT_NE(out.find('\r'), std::string::npos);
  EXPECT_EQ(out.back(), '\n');
  close(slave);
  close(master);
}

}  // namespace
