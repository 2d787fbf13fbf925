// Helpers for tests that compare with PyTorch: run /usr/bin/python3 (Debian python3-torch;
// the python3 on PATH may have no torch) on a script, in a fresh temporary directory.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <stdlib.h>

namespace datapar::testing {

inline bool have_python_torch() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return ok;
}

// A new directory under the test temp dir, so that concurrent test runs never share files.
inline std::string make_temp_dir(const std::string& prefix) {
  std::string dir = ::testing::TempDir() + "/" + prefix + "_XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << dir;
  return dir;
}

// Writes `script` to dir/name and runs it with /usr/bin/python3 and `args`; returns the
// exit status (0 on success). PYTHONPATH includes the repository's python/ folder.
inline int run_python(const std::string& dir, const std::string& name, const std::string& script,
                      const std::string& args = "") {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << script;
  const std::string command = "PYTHONPATH='" DATAPAR_SOURCE_DIR "/python' /usr/bin/python3 '" + path + "' " + args;
  return std::system(command.c_str());
}

}  // namespace datapar::testing
