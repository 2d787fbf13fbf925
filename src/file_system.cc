// See file_system.h.
#include "file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace datapar::detail {

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string parent_directory(const std::string& path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;  // "a/b/" names b too
  const size_t slash = path.rfind('/', end - 1);
  if (slash == std::string::npos) return "";
  size_t keep = slash;
  while (keep > 0 && path[keep - 1] == '/') --keep;
  return keep == 0 ? "/" : path.substr(0, keep);
}

std::string directory_of(const std::string& path) {
  const std::string parent = parent_directory(path);
  return parent.empty() ? "." : parent;
}

std::string make_directories(const std::string& path) {
  if (path.empty() || is_directory(path)) return "";
  // Made by another process or thread since is_directory above (ranks make one checkpoint
  // directory at once) is no error; anything else there is.
  if (exists(path) && !is_directory(path)) return path + ": exists and is not a directory";
  const std::string parent = parent_directory(path);
  if (!parent.empty() && parent != path) {
    std::string problem = make_directories(parent);
    if (!problem.empty()) return problem;
  }
  if (::mkdir(path.c_str(), 0777) != 0 && !(errno == EEXIST && is_directory(path))) {
    return path + ": " + std::strerror(errno);
  }
  return "";
}

namespace {

thread_local int removed_count = 0;

int remove_entry(const char* path, const struct stat*, int type, struct FTW*) {
  if ((type == FTW_DP ? ::rmdir(path) : ::unlink(path)) == 0) ++removed_count;
  return 0;  // go on: remove what can be removed
}

}  // namespace

int remove_tree(const std::string& path) noexcept {
  if (!exists(path)) return 0;
  removed_count = 0;
  // Depth first (contents before their directory), never crossing a link.
  ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return removed_count;
}

std::vector<std::string> list_directory(const std::string& path) {
  std::vector<std::string> names;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

RegularFile open_regular_file(const std::string& path) {
  RegularFile file;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    file.error = errno;
    return file;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    file.irregular = true;
    return file;
  }
  file.fd = fd;
  file.size = static_cast<int64_t>(st.st_size);
  return file;
}

}  // namespace datapar::detail
