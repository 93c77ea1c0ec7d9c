// StderrCapture: what the process writes to stderr (the structured logs,
// daemon/obs/log.h) while the object lives, for tests that check a log
// line. Not thread-safe against another capture; one at a time.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace idem::testing {

class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = dup(2);
    char tmpl[] = "/tmp/idem-stderr-XXXXXX";
    fd_ = mkstemp(tmpl);
    path_ = tmpl;
    dup2(fd_, 2);
  }
  ~StderrCapture() { Finish(); }
  std::string Finish() {
    if (saved_ >= 0) {
      std::fflush(stderr);
      dup2(saved_, 2);
      close(saved_);
      close(fd_);
      saved_ = -1;
      std::ifstream in(path_);
      std::stringstream text;
      text << in.rdbuf();
      text_ = text.str();
      unlink(path_.c_str());
    }
    return text_;
  }

 private:
  int saved_ = -1;
  int fd_ = -1;
  std::string path_;
  std::string text_;
};

}  // namespace idem::testing
