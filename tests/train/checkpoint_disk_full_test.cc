// A checkpoint write that runs out of disk: a clear error naming the file and the cause, the
// earlier checkpoints intact and nothing half-written left behind. The disk is a small tmpfs
// (needs root for mount; skipped with the reason otherwise).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "datapar/error.h"
#include "datapar/train/checkpoint.h"
#include "testing/temp_dir.h"
#include "file_system.h"  // not std::filesystem (src/file_system.h)

namespace datapar::train {
namespace {


// A tmpfs of `bytes` mounted on a fresh directory for the test's lifetime.
class SmallDisk {
 public:
  explicit SmallDisk(size_t bytes) {
    const std::string options = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", dir().c_str(), "tmpfs", 0, options.c_str()) != 0) {
      problem_ = std::string("cannot mount a tmpfs (") + std::strerror(errno) + "): needs root (CAP_SYS_ADMIN)";
    }
  }
  ~SmallDisk() {
    if (problem_.empty()) ::umount2(dir().c_str(), MNT_DETACH);  // before mount_point_ goes
  }
  const std::string& problem() const { return problem_; }
  const std::string& dir() const { return mount_point_.path(); }

 private:
  testing::TempDir mount_point_{"small_disk"};
  std::string problem_;
};

TEST(CheckpointDiskFull, ClearErrorAndTheEarlierCheckpointsIntact) {
  SmallDisk disk(256 << 10);
  if (!disk.problem().empty()) GTEST_SKIP() << disk.problem();
  torch::nn::Linear model(100, 100);  // ~40 KB of parameters: a few checkpoints fill 256 KiB
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  int64_t written = 0;
  std::string error;
  for (int64_t epoch = 1; epoch <= 20 && error.empty(); ++epoch) {
    try {
      save_checkpoint(make_checkpoint(*model, sgd, epoch), checkpoint_path(disk.dir(), epoch), 0);
      written = epoch;
    } catch (const CheckpointError& e) {
      error = e.what();
    }
  }
  ASSERT_FALSE(error.empty()) << "20 checkpoints fit into 256 KiB?";
  ASSERT_GE(written, 1);
  EXPECT_NE(error.find(checkpoint_path(disk.dir(), written + 1)), std::string::npos) << error;
  EXPECT_NE(error.find(std::strerror(ENOSPC)), std::string::npos) << error;
  // The newest complete checkpoint is the latest one, and it loads; no temporary is left.
  ASSERT_EQ(latest_checkpoint(disk.dir()), checkpoint_path(disk.dir(), written));
  const Checkpoint last = load_checkpoint(checkpoint_path(disk.dir(), written));
  EXPECT_EQ(last.epoch, written);
  EXPECT_FALSE(datapar::detail::exists(checkpoint_path(disk.dir(), written + 1)));
  int files = 0;
  for (const std::string& name : datapar::detail::list_directory(disk.dir())) {
    ++files;
    EXPECT_EQ(name.rfind("checkpoint-epoch-", 0), 0u) << "left behind: " << name;
  }
  EXPECT_EQ(files, written);
}

}  // namespace
}  // namespace datapar::train
