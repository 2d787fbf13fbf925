// See link_bytes.h.
#include "link_bytes.h"

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace datapar::tools {

int64_t link_tx_bytes() {
  const std::string root = "/sys/class/net";
  DIR* dir = ::opendir(root.c_str());
  if (dir == nullptr) return 0;
  int64_t total = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == ".." || name == "lo") continue;
    std::ifstream counter(root + "/" + name + "/statistics/tx_bytes");
    int64_t bytes = 0;
    if (counter >> bytes) total += bytes;
  }
  ::closedir(dir);
  return total;
}

}  // namespace datapar::tools
