// Files and directories a process names after its pid (datapar-launch-<pid>-*, the
// shared-memory collectives' regions /datapar-shm-<pid>-*) are removed by that process when
// it ends; a process killed with SIGKILL cannot, so the next process that makes such a name
// removes those of processes that no longer exist.
#pragma once

#include <string>

namespace datapar::detail {

// Removes every entry of `dir` named `<prefix><pid>-...` whose pid is not a live process,
// files and whole directories; returns how many. Entries of live processes, of other users,
// and names that do not parse are left alone. Never throws.
int remove_stale_entries(const std::string& dir, const std::string& prefix) noexcept;

}  // namespace datapar::detail
