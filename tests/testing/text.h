// Reading what a test's programs wrote: files and their output.
#pragma once

#include <fstream>
#include <iterator>
#include <string>

namespace datapar::testing {

// The whole file at `path`, byte for byte ("" if it cannot be read).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// How many times `text` holds `what`, without overlaps.
inline int count(const std::string& text, const std::string& what) {
  int found = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++found;
  return found;
}

}  // namespace datapar::testing
