// Helpers for tests that compare with PyTorch: run a Python that has torch on a script,
// written into the caller's directory (a testing::TempDir of temp_dir.h).
//
// The interpreter: $DATAPAR_TEST_PYTHON, else the one CMake chose to match the Torch datapar
// is built with (DATAPAR_TEST_PYTHON in CMake: Debian's /usr/bin/python3 for Debian's
// libtorch, the virtual environment's python for pip's torch). A Python without torch is a
// test failure that says so, never a silent skip.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#ifndef DATAPAR_TEST_PYTHON
#error "tests/CMakeLists.txt defines DATAPAR_TEST_PYTHON, the interpreter for the Python interop tests"
#endif

namespace datapar::testing {

inline std::string python() {
  const char* chosen = std::getenv("DATAPAR_TEST_PYTHON");
  return chosen != nullptr && *chosen != '\0' ? chosen : DATAPAR_TEST_PYTHON;
}

// Why the interop tests cannot run with python() ("" when they can). Checked once.
inline const std::string& python_problem() {
  static const std::string problem = [] {
    const std::string interpreter = python();
    if (std::system(("'" + interpreter + "' -c 'import torch' >/dev/null 2>&1").c_str()) == 0) return std::string();
    return "the Python interop tests need a Python with torch, and " + interpreter +
           " cannot import torch. Set DATAPAR_TEST_PYTHON to one (Debian: apt-get install python3-torch, "
           "/usr/bin/python3; pip: the virtual environment scripts/setup_torch.sh makes), or configure with "
           "-DDATAPAR_TEST_PYTHON=...";
  }();
  return problem;
}

// A test that compares with PyTorch starts with this: it fails, saying why, without one.
#define DATAPAR_REQUIRE_PYTHON_TORCH()                                      \
  do {                                                                      \
    if (!::datapar::testing::python_problem().empty())                      \
      FAIL() << ::datapar::testing::python_problem();                       \
  } while (0)

// Runs python() on the script file at `path` with `args`; returns the exit status (0 on
// success). PYTHONPATH includes the repository's python/ folder.
inline int run_python_file(const std::string& path, const std::string& args = "") {
  const std::string command =
      "PYTHONPATH='" DATAPAR_SOURCE_DIR "/python' '" + python() + "' '" + path + "' " + args;
  return std::system(command.c_str());
}

// Writes `script` to dir/name and runs it (run_python_file).
inline int run_python(const std::string& dir, const std::string& name, const std::string& script,
                      const std::string& args = "") {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << script;
  return run_python_file(path, args);
}

#ifdef DATAPAR_DCP_PYTHON
// PyTorch 2.15's Python (scripts/setup_torch.sh), whichever libtorch datapar is built with:
// what the tests that compare with torch.distributed.checkpoint or FSDP2 (fully_shard, a
// device mesh) run; Debian's python3-torch, 1.13, has neither. $DATAPAR_DCP_PYTHON
// overrides it.
inline std::string pytorch215_python() {
  const char* chosen = std::getenv("DATAPAR_DCP_PYTHON");
  return chosen != nullptr && *chosen != '\0' ? chosen : DATAPAR_DCP_PYTHON;
}

// A test that compares with PyTorch 2.15 starts with this: it fails, saying why, without it.
#define DATAPAR_REQUIRE_PYTORCH_215()                                                                      \
  do {                                                                                                     \
    const std::string check = "'" + ::datapar::testing::pytorch215_python() +                              \
                              "' -c 'import torch, torch.distributed.checkpoint; "                         \
                              "assert torch.__version__.startswith(\"2.15.\")' >/dev/null 2>&1";           \
    if (std::system(check.c_str()) != 0) {                                                                 \
      FAIL() << "this test compares with PyTorch 2.15, and " << ::datapar::testing::pytorch215_python()    \
             << " is not one. Run scripts/setup_torch.sh (make test does), or set DATAPAR_DCP_PYTHON";     \
    }                                                                                                      \
  } while (0)
#endif

}  // namespace datapar::testing
