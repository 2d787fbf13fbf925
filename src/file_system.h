// Files and directories by POSIX calls, never std::filesystem: pip's torch wheels (2.5 to at
// least 2.11) export a static copy of libstdc++'s std::filesystem from libtorch (PyTorch
// issue 133437), and a program that calls std::filesystem binds to that copy first; its
// remove_all jumped to address 0 on a GPU node (torch 2.11+cu130). The CTest
// no_std_filesystem_imports keeps every datapar binary free of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace datapar::detail {

bool exists(const std::string& path);        // anything there, a dangling link too
bool is_directory(const std::string& path);  // following links

// The directory part of `path`, as std::filesystem::path::parent_path: "a/b" -> "a",
// "/x" -> "/", "x" -> "".
std::string parent_directory(const std::string& path);

// The directory that holds the entry `path`: parent_directory, or "." for a bare name.
std::string directory_of(const std::string& path);

// Makes `path` and any missing parents (mode 0777 less the umask); "" on success, else
// what failed (strerror) for the first directory that could not be made.
std::string make_directories(const std::string& path);

// Removes `path` and, for a directory, everything in it, links not followed. Returns how
// many entries it removed (0 when there was nothing). Never throws.
int remove_tree(const std::string& path) noexcept;

// The names in directory `path` but . and .., in no particular order; empty when it cannot
// be read.
std::vector<std::string> list_directory(const std::string& path);

// A file opened for reading only if it is a regular one, without blocking: a FIFO or a
// device planted under its name would block open() or read without end (issue 46).
struct RegularFile {
  int fd = -1;              // open (O_CLOEXEC), the caller's to close; -1: not opened
  int64_t size = 0;
  int error = 0;            // open()'s errno when fd is -1 and the file is not irregular
  bool irregular = false;   // there, but a FIFO, device, socket or directory: refused
};
RegularFile open_regular_file(const std::string& path);

}  // namespace datapar::detail
