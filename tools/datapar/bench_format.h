// Number formatting shared by the bench tools and bench/collectives_reference, so their
// tables line up row for row.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace datapar::tools {

// 4096 -> "4 KiB", 1572864 -> "1.5 MiB".
inline std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof(text), v == static_cast<int64_t>(v) ? "%.0f %s" : "%.1f %s", v, units[u]);
  return text;
}

// The middle value (the mean of the two in the middle for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace datapar::tools
