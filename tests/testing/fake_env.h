// fake_env: an Environment (datapar/environment.h) holding just the given variables, so a
// test can stand in for torchrun, mpirun or srun without touching the process environment.
//
//   const JobConfig config = resolve_job_config(testing::fake_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
#pragma once

#include <map>
#include <optional>
#include <string>

#include "datapar/environment.h"

namespace datapar::testing {

inline Environment fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace datapar::testing
