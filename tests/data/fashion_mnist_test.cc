#include "datapar/data/fashion_mnist.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <sys/stat.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "datapar/error.h"
#include "testing/expect_throw.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

const std::string kShipped = DATAPAR_SOURCE_DIR "/data/fashion-mnist";
const std::string kFull = DATAPAR_SOURCE_DIR "/../shared/datasets/fashion-mnist";

std::vector<int64_t> class_counts(const at::Tensor& labels) {
  const at::Tensor counts = labels.bincount(/*weights=*/{}, /*minlength=*/10);
  return {counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel()};
}

// Writes an IDX file (gzipped): header of magic + dims, then prod(dims) bytes (or `payload`).
void write_idx(const std::string& path, uint32_t magic, const std::vector<uint32_t>& dims, int64_t payload = -1,
               int value = 1) {
  std::string out;
  auto put = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
  };
  put(magic);
  int64_t n = 1;
  for (uint32_t d : dims) {
    put(d);
    n *= d;
  }
  out.append(static_cast<size_t>(payload < 0 ? n : payload), static_cast<char>(value));
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  gzwrite(f, out.data(), static_cast<unsigned>(out.size()));
  gzclose(f);
}

FashionMnistOptions options_for(const std::string& root, bool train = true) {
  FashionMnistOptions o;
  o.root = root;
  o.train = train;
  return o;
}

TEST(FashionMnist, TheShippedSubsetHasTheDocumentedCounts) {
  FashionMnist train(options_for(kShipped));
  FashionMnist test(options_for(kShipped, false));
  EXPECT_EQ(train.size(), 6000);
  EXPECT_EQ(test.size(), 1000);
  EXPECT_EQ(train.data().sizes(), (std::vector<int64_t>{6000, 1, 28, 28}));
  EXPECT_EQ(train.data().scalar_type(), at::kFloat);
  EXPECT_EQ(train.target().sizes(), (std::vector<int64_t>{6000}));
  EXPECT_EQ(train.target().scalar_type(), at::kLong);
  EXPECT_EQ(train.images_path(), kShipped + "/train-images-idx3-ubyte.gz");
  EXPECT_EQ(test.labels_path(), kShipped + "/t10k-labels-idx1-ubyte.gz");
  // The per-class counts that data/fashion-mnist/README.md gives: roughly balanced.
  EXPECT_EQ(class_counts(train.target()), (std::vector<int64_t>{560, 643, 608, 612, 584, 594, 590, 617, 590, 602}));
  EXPECT_EQ(class_counts(test.target()), (std::vector<int64_t>{107, 105, 111, 93, 115, 87, 97, 95, 95, 95}));
  // Fashion-MNIST's first training image is an ankle boot (9), the second a T-shirt (0).
  EXPECT_EQ(train.target()[0].item<int64_t>(), 9);
  EXPECT_EQ(train.target()[1].item<int64_t>(), 0);
  // Pixels scaled to [0, 1], using the whole range; the mean is near the full set's 0.2860.
  EXPECT_EQ(train.data().min().item<float>(), 0.0f);
  EXPECT_EQ(train.data().max().item<float>(), 1.0f);
  EXPECT_NEAR(train.data().mean().item<double>(), 0.2860, 0.01);
}

TEST(FashionMnist, NormalisesOnRequest) {
  FashionMnistOptions o = options_for(kShipped, false);
  o.normalize = true;
  FashionMnist normalised(o);
  FashionMnist raw(options_for(kShipped, false));
  EXPECT_TRUE(at::allclose(normalised.data(), (raw.data() - 0.2860) / 0.3530));
}

// The library has no default directory (it holds no path of the source tree; `datapar
// train` gives one): an empty root is refused, whatever the environment says.
TEST(FashionMnist, NeedsARoot) {
  ::setenv("DATAPAR_FASHION_MNIST_DIR", kShipped.c_str(), 1);
  EXPECT_THROW_MSG(FashionMnist(FashionMnistOptions{}), InvalidArgumentError,
                   "FashionMnist: no directory given. Set FashionMnistOptions::root");
  ::unsetenv("DATAPAR_FASHION_MNIST_DIR");
}

TEST(FashionMnist, TheFullDatasetMatchesTheSubset) {
  struct stat st {};
  if (::stat((kFull + "/train-images-idx3-ubyte.gz").c_str(), &st) != 0) {
    GTEST_SKIP() << "the full Fashion-MNIST is not at " << kFull << " (../shared/datasets/fashion-mnist)";
  }
  FashionMnist train(options_for(kFull));
  FashionMnist test(options_for(kFull, false));
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(class_counts(train.target()), std::vector<int64_t>(10, 6000));
  EXPECT_EQ(class_counts(test.target()), std::vector<int64_t>(10, 1000));
  EXPECT_NEAR(train.data().mean().item<double>(), 0.2860, 5e-4);
  EXPECT_NEAR(train.data().std().item<double>(), 0.3530, 5e-4);
  FashionMnist subset(options_for(kShipped));
  EXPECT_TRUE(at::equal(train.data().slice(0, 0, 6000), subset.data()));
  EXPECT_TRUE(at::equal(test.target().slice(0, 0, 1000), FashionMnist(options_for(kShipped, false)).target()));
}

TEST(FashionMnist, MissingDirectoryOrFilesAreNamed) {
  EXPECT_THROW_MSG(FashionMnist(options_for("/no/such/dir")), InvalidArgumentError,
                   "FashionMnist: directory /no/such/dir does not exist");
  const testing::TempDir temp("fmnist_missing");
  const std::string& dir = temp.path();
  write_idx(dir + "/train-images-idx3-ubyte.gz", 0x803, {2, 28, 28});
  EXPECT_THROW_MSG(FashionMnist(options_for(dir)), InvalidArgumentError,
                   dir + " has no train-labels-idx1-ubyte or train-labels-idx1-ubyte.gz");
  EXPECT_THROW_MSG(FashionMnist(options_for(dir, false)), InvalidArgumentError, "has no t10k-images-idx3-ubyte");
}

TEST(FashionMnist, BadFilesAreNamedWithTheProblem) {
  const testing::TempDir temp("fmnist_bad");
  const std::string& dir = temp.path();
  const std::string images = dir + "/train-images-idx3-ubyte.gz";
  const std::string labels = dir + "/train-labels-idx1-ubyte.gz";
  write_idx(images, 0x803, {5, 28, 28});
  write_idx(labels, 0x801, {4});
  EXPECT_THROW_MSG(FashionMnist(options_for(dir)), Error,
                   "FashionMnist: " + images + " has 5 images but " + labels + " has 4 labels");
  write_idx(labels, 0x801, {5}, -1, 10);
  EXPECT_THROW_MSG(FashionMnist(options_for(dir)), Error, labels + ": label 10 is outside 0..9");
  write_idx(labels, 0x803, {5, 28, 28});  // an image file where the labels belong
  EXPECT_THROW_MSG(FashionMnist(options_for(dir)), Error, labels + ": magic number is 0x00000803, expected 0x00000801");
  write_idx(labels, 0x801, {5});
  write_idx(images, 0x803, {5, 27, 28});
  EXPECT_THROW_MSG(FashionMnist(options_for(dir)), Error, images + ": images are 27x28, expected 28x28");
  write_idx(images, 0x803, {5, 28, 28}, 28 * 28 * 4);
  EXPECT_THROW_MSG(FashionMnist(options_for(dir)), Error, images + ": ends early: 3152 of 3936 bytes");
  write_idx(images, 0x803, {5, 28, 28}, -1, 255);
  FashionMnist ok(options_for(dir));
  EXPECT_EQ(ok.size(), 5);
  EXPECT_EQ(ok.data().min().item<float>(), 1.0f);
}

TEST(FashionMnist, PlainFilesWinOverGzipped) {
  const testing::TempDir temp("fmnist_plain");
  const std::string& dir = temp.path();
  write_idx(dir + "/t10k-images-idx3-ubyte.gz", 0x803, {3, 28, 28});
  write_idx(dir + "/t10k-labels-idx1-ubyte.gz", 0x801, {3});
  // An uncompressed copy with other values beside the .gz: it is the one read.
  write_idx(dir + "/t10k-labels-idx1-ubyte.tmp.gz", 0x801, {3}, -1, 7);
  ASSERT_EQ(std::system(("gzip -dc '" + dir + "/t10k-labels-idx1-ubyte.tmp.gz' > '" + dir +
                         "/t10k-labels-idx1-ubyte'").c_str()),
            0);
  FashionMnist test(options_for(dir, false));
  EXPECT_EQ(test.labels_path(), dir + "/t10k-labels-idx1-ubyte");
  EXPECT_TRUE(at::equal(test.target(), at::full({3}, 7, at::kLong)));
}

TEST(FashionMnist, LimitReadsTheFirstSamplesOnly) {
  FashionMnistOptions o = options_for(kShipped);
  o.limit = 100;
  const FashionMnist first(o);
  const FashionMnist all(options_for(kShipped));
  EXPECT_EQ(first.size(), 100);
  EXPECT_TRUE(at::equal(first.data(), all.data().slice(0, 0, 100)));
  EXPECT_TRUE(at::equal(first.target(), all.target().slice(0, 0, 100)));
  o.limit = 100000;  // more than the split has: all of it
  EXPECT_EQ(FashionMnist(o).size(), 6000);
  o.limit = -1;
  EXPECT_THROW_MSG(FashionMnist(o), InvalidArgumentError, "FashionMnist: limit is -1");

  // The counts are still compared, from the headers, and a file past the limit is not read.
  const testing::TempDir temp("fmnist_limit");
  const std::string& dir = temp.path();
  write_idx(dir + "/train-images-idx3-ubyte.gz", 0x803, {5, 28, 28}, 28 * 28 * 3);  // 3 of 5 present
  write_idx(dir + "/train-labels-idx1-ubyte.gz", 0x801, {5});
  o = options_for(dir);
  o.limit = 3;
  EXPECT_EQ(FashionMnist(o).size(), 3);
  o.limit = 4;
  EXPECT_THROW_MSG(FashionMnist(o), Error, "ends early");
  write_idx(dir + "/train-labels-idx1-ubyte.gz", 0x801, {4});
  o.limit = 2;
  EXPECT_THROW_MSG(FashionMnist(o), Error, "has 5 images but " + dir + "/train-labels-idx1-ubyte.gz has 4 labels");
}

TEST(FashionMnist, AnEmptySplitIsAnError) {
  const testing::TempDir temp("fmnist_empty");
  const std::string& dir = temp.path();
  write_idx(dir + "/t10k-images-idx3-ubyte.gz", 0x803, {0, 28, 28});
  write_idx(dir + "/t10k-labels-idx1-ubyte.gz", 0x801, {0});
  EXPECT_THROW_MSG(FashionMnist(options_for(dir, false)), Error, dir + "/t10k-images-idx3-ubyte.gz: holds 0 samples");
}

}  // namespace
}  // namespace datapar
