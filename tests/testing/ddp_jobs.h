// DDP test jobs: ddp_probe processes (tests/testing/ddp_probe.cc) over loopback on the
// Gloo backend, and their result against one process training on the concatenated batches.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "datapar/state_dict.h"
#include "testing/ddp_scenarios.h"
#include "testing/processes.h"
#include "testing/temp_dir.h"

namespace datapar::testing {

// Runs `scenario` on `world` ddp_probe processes, each training on `device` ("cpu", or
// "cuda:0": CUDA tensors staged through the gloo group); returns their results.
inline std::vector<ProcessResult> run_ddp_job(const std::string& scenario, int world, const TempDir& dir,
                                              const std::string& device = "cpu",
                                              std::chrono::seconds deadline = std::chrono::seconds(120),
                                              bool* timed_out = nullptr) {
  const std::string init = "file://" + dir.path() + "/store";  // no port to agree on in advance
  std::vector<std::vector<std::string>> commands;
  for (int r = 0; r < world; ++r) {
    commands.push_back({std::string(DATAPAR_BIN_DIR) + "/ddp_probe", scenario, init, std::to_string(r),
                        std::to_string(world), dir.path() + "/rank" + std::to_string(r) + ".pt", device});
  }
  return run_processes(commands, dir.path(), deadline, timed_out);
}

// Runs `name` on `world` ranks on `device` and expects every rank's final parameters to be
// those of one process on the CPU within rtol and atol. Returns rank 0's output.
inline std::string expect_matches_reference(const std::string& name, int world, double rtol, double atol,
                                            const std::string& device = "cpu") {
  TempDir dir("ddp");
  const auto results = run_ddp_job(name, world, dir, device);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    if (results[r].exit_code != 0) return "";
  }
  const DdpScenario s = scenario(name, world);
  const StateDict expected = s.sync_bn ? state_dict(*train_reference<SyncBnNet>(s)) : state_dict(*train_reference<ProbeNet>(s));
  for (int r = 0; r < world; ++r) {
    const StateDict got = load_state_dict_file(dir.path() + "/rank" + std::to_string(r) + ".pt");
    EXPECT_EQ(got.size(), expected.size());
    if (got.size() != expected.size()) return "";
    for (const auto& item : expected) {
      const at::Tensor& mine = got[item.key()];
      EXPECT_TRUE(at::allclose(mine, item.value(), rtol, atol))
          << name << " on " << device << " at world size " << world << ", rank " << r << ", " << item.key()
          << ": max difference " << (mine - item.value()).abs().max().item<double>();
    }
  }
  return results[0].output;
}

}  // namespace datapar::testing
