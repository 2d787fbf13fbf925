// TempDir: a fresh directory for one test, removed with everything in it when the TempDir
// goes out of scope. Every test that needs files makes its own, so concurrent test runs
// (ctest -j, two build trees) never see each other's files and none are left behind.
//
//   testing::TempDir dir("checkpoint");
//   save_checkpoint(checkpoint, dir.path() + "/step_1.pt", 0);
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "file_system.h"  // not std::filesystem: src/file_system.h says why

namespace datapar::testing {

class TempDir {
 public:
  // Makes $TMPDIR/datapar-<prefix>-XXXXXX (under /tmp when TMPDIR is unset or empty).
  // Throws std::runtime_error, naming the directory and the reason, when it cannot.
  explicit TempDir(const std::string& prefix = "test") : owner_(::getpid()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/datapar-" + prefix + "-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("TempDir: cannot make " + pattern + ": " + std::strerror(errno));
    }
    path_ = pattern;
  }

  // Only the process that made it removes it: a forked child that unwinds through here
  // must not delete files its parent still uses.
  ~TempDir() {
    if (::getpid() != owner_) return;
    detail::remove_tree(path_);  // never throws; a leftover is harmless
  }

  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The directory's absolute path, without a trailing slash.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  pid_t owner_;
};

}  // namespace datapar::testing
