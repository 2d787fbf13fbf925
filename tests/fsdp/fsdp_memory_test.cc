// FSDP trains what does not fit: real processes (fsdp_probe) whose data segment may grow by
// a budget smaller than the model's whole training state. Under DDP every rank holds that
// state and runs out of memory with an error (not a hang); under FSDP each holds half.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "testing/processes.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

// fsdp_probe's model: 32M float32 parameters, so 512 MiB of parameters, gradients and Adam's
// two moments when whole (DDP adds 128 MiB of buckets); sharded over 2 ranks, 256 MiB per
// rank plus the units gathered, a unit's gradients in flight and the activations (~120 MiB).
constexpr int kBudgetMib = 480;

// GCC says __SANITIZE_ADDRESS__; clang (the asan leg's compiler) __has_feature.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

std::vector<testing::ProcessResult> job(const std::string& mode, int world, const testing::TempDir& dir) {
  const std::string init = "file://" + dir.path() + "/store-" + mode;
  std::vector<std::vector<std::string>> commands;
  for (int r = 0; r < world; ++r) {
    commands.push_back({std::string(DATAPAR_BIN_DIR) + "/fsdp_probe", mode, init, std::to_string(r),
                        std::to_string(world), std::to_string(kBudgetMib)});
  }
  bool timed_out = false;
  auto results = testing::run_processes(commands, dir.path(), 120s, &timed_out);
  EXPECT_FALSE(timed_out) << mode << ": a rank hung";
  return results;
}

TEST(FullyShardedDataParallel, TrainsAModelWhoseWholeTrainingStateExceedsTheMemoryLimit) {
  if (kAddressSanitizer) {
    GTEST_SKIP() << "under AddressSanitizer freed memory stays in its quarantine, so the data segment measures "
                    "ASan, not the training state";
  }
  testing::TempDir dir("fsdp-memory");
  const auto sharded = job("fsdp", 2, dir);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(sharded[r].exit_code, 0) << "fsdp rank " << r << ":\n" << sharded[r].output;
    EXPECT_NE(sharded[r].output.find("trained 3 steps"), std::string::npos) << sharded[r].output;
  }
  const auto whole = job("ddp", 2, dir);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(whole[r].exit_code, 1) << "ddp rank " << r << ":\n" << whole[r].output;
    EXPECT_NE(whole[r].output.find("can't allocate memory"), std::string::npos) << whole[r].output;
  }
}

}  // namespace
}  // namespace datapar
