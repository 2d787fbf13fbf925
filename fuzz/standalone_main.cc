// A main() for the fuzz targets when they are not built with libFuzzer (gcc, or a build
// without DATAPAR_FUZZ): runs LLVMFuzzerTestOneInput once on every file named on the command
// line, or every file in a named directory, so the seed corpora are replayed as a regression
// test in every build. Exits non-zero if an input cannot be read; a crash is a crash.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> inputs(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  if (!S_ISDIR(st.st_mode)) return {path};
  std::vector<std::string> out;
  if (DIR* dir = ::opendir(path.c_str())) {
    while (const dirent* e = ::readdir(dir)) {
      if (e->d_name[0] != '.') out.push_back(path + "/" + e->d_name);
    }
    ::closedir(dir);
  }
  std::sort(out.begin(), out.end());  // a stable order for reproducible output
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  size_t runs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::vector<std::string> files = inputs(argv[i]);
    if (files.empty()) {
      std::fprintf(stderr, "%s: no input at %s\n", argv[0], argv[i]);
      return 2;
    }
    for (const std::string& file : files) {
      std::ifstream in(file, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) {
        std::fprintf(stderr, "%s: cannot read %s\n", argv[0], file.c_str());
        return 2;
      }
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++runs;
    }
  }
  std::printf("%s: %zu inputs ran\n", argv[0], runs);
  return 0;
}
