// Fashion-MNIST / MNIST loading. See fashion_mnist.h.
#include "datapar/data/fashion_mnist.h"

#include <ATen/ATen.h>

#include <sys/stat.h>

#include <utility>

#include "datapar/data/idx_file.h"
#include "datapar/error.h"

namespace datapar {
namespace {

constexpr int64_t kSide = 28;

bool exists(const std::string& path, bool directory) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && (directory ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

// root/name, or root/name.gz; the plain file wins when both exist (it is the one a user
// unpacked on purpose).
std::string find_file(const std::string& root, const std::string& name) {
  const std::string plain = root + "/" + name;
  if (exists(plain, false)) return plain;
  if (exists(plain + ".gz", false)) return plain + ".gz";
  throw InvalidArgumentError(detail::str_cat("FashionMnist: ", root, " has no ", name, " or ", name,
                                             ".gz. Put the four IDX files of Fashion-MNIST (or MNIST) there, "
                                             "or point root at the repository's subset, data/fashion-mnist."));
}

// The library knows no default directory (it holds no path of the source tree it was built
// from): the caller names one, as `datapar train` does (tools/datapar/train_options.cc).
std::string checked_root(const FashionMnistOptions& options) {
  const std::string& root = options.root;
  DATAPAR_CHECK(!root.empty(), "FashionMnist: no directory given. Set FashionMnistOptions::root to the directory ",
                "with the IDX files (the repository ships a subset in data/fashion-mnist).");
  DATAPAR_CHECK(exists(root, true), "FashionMnist: directory ", root,
                " does not exist. Set FashionMnistOptions::root to the directory with the IDX files.");
  return root;
}

}  // namespace

struct FashionMnist::Loaded {
  at::Tensor images;  // (N, 1, 28, 28) float
  at::Tensor labels;  // (N,) int64
  std::string images_path;
  std::string labels_path;
};

FashionMnist::FashionMnist(const FashionMnistOptions& options) : FashionMnist([&options] {
  const std::string root = checked_root(options);
  const std::string split = options.train ? "train" : "t10k";
  Loaded out;
  out.images_path = find_file(root, split + "-images-idx3-ubyte");
  out.labels_path = find_file(root, split + "-labels-idx1-ubyte");
  DATAPAR_CHECK(options.limit >= 0, "FashionMnist: limit is ", options.limit, "; use 0 (every sample) or a positive count.");
  if (options.limit > 0) {  // the counts, from the headers: the files are not read to the end
    const int64_t images = read_idx_dims(out.images_path, 3)[0];
    const int64_t labels = read_idx_dims(out.labels_path, 1)[0];
    if (images != labels) {
      throw Error(detail::str_cat("FashionMnist: ", out.images_path, " has ", images, " images but ", out.labels_path,
                                  " has ", labels, " labels. Use the images and labels of the same release and split."));
    }
  }
  const at::Tensor pixels = read_idx_file(out.images_path, 3, options.limit);  // (N, 28, 28) uint8
  const at::Tensor labels = read_idx_file(out.labels_path, 1, options.limit);  // (N,) uint8
  if (pixels.size(1) != kSide || pixels.size(2) != kSide) {
    throw Error(detail::str_cat(out.images_path, ": images are ", pixels.size(1), "x", pixels.size(2),
                                ", expected 28x28. Is it an MNIST-family file?"));
  }
  if (pixels.size(0) != labels.size(0)) {
    throw Error(detail::str_cat("FashionMnist: ", out.images_path, " has ", pixels.size(0), " images but ",
                                out.labels_path, " has ", labels.size(0),
                                " labels. Use the images and labels of the same release and split."));
  }
  const int64_t max_label = labels.numel() ? labels.max().item<int64_t>() : 0;
  if (max_label >= static_cast<int64_t>(kFashionMnistClasses.size())) {
    throw Error(detail::str_cat(out.labels_path, ": label ", max_label, " is outside 0..9; the file is corrupt."));
  }
  DATAPAR_CHECK(!options.normalize || options.std > 0, "FashionMnist: std is ", options.std,
                "; normalisation divides by it, so it must be positive.");
  out.images = pixels.unsqueeze(1).to(at::kFloat).div_(255.0);
  if (options.normalize) out.images.sub_(options.mean).div_(options.std);
  out.labels = labels.to(at::kLong);
  return out;
}()) {}

FashionMnist::FashionMnist(Loaded loaded)
    : TensorDataset(std::move(loaded.images), std::move(loaded.labels)),
      images_path_(std::move(loaded.images_path)),
      labels_path_(std::move(loaded.labels_path)) {}

}  // namespace datapar
