// Fashion-MNIST (and MNIST, which has the same files) as an in-memory dataset.
//
// A root directory holds the four IDX files under their original names, each either
// gzip-compressed (".gz") or plain:
//   train-images-idx3-ubyte  train-labels-idx1-ubyte   (split train: 60,000 in the full set)
//   t10k-images-idx3-ubyte   t10k-labels-idx1-ubyte    (split test: 10,000)
// The repository ships a real subset in data/fashion-mnist/ (6000 train, 1000 test
// images; see its README), which `datapar train` reads by default. Images become (N, 1, 28, 28) float
// in [0, 1] (optionally normalised); labels (N,) int64 in 0..9.
//
// Loading reads and checks everything up front (magic numbers, 28x28, equal counts, exact
// file lengths), so a bad file fails at construction with its name, never mid-training.
// With a limit, only the first `limit` samples are read (and checked), so memory follows
// the limit; the counts are still compared, from the headers.
#pragma once

#include <array>
#include <string>

#include "datapar/data/dataset.h"

namespace datapar {

// Labels 0..9 of Fashion-MNIST.
inline constexpr std::array<const char*, 10> kFashionMnistClasses{
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

struct FashionMnistOptions {
  // Directory with the IDX files. Required: the library has no default (the installed
  // library knows nothing of the source tree's data/fashion-mnist).
  std::string root;
  // true: the train-* files; false: the t10k-* (test) files. As torchvision's train=.
  bool train = true;
  // Subtract mean and divide by std after scaling to [0, 1]. The defaults are the full
  // Fashion-MNIST training set's statistics (use 0.1307 / 0.3081 for MNIST).
  bool normalize = false;
  double mean = 0.2860;
  double std = 0.3530;
  // Read only the first `limit` samples of the split (all of them if it has fewer); 0: all.
  // The rest of each file is not read, so memory and loading time follow the limit.
  int64_t limit = 0;
};

class FashionMnist : public TensorDataset {
 public:
  // Reads the split. Throws InvalidArgumentError when the directory or a file is missing
  // (naming what is missing) or limit < 0, Error when a file is corrupt, holds no samples,
  // or the files disagree.
  explicit FashionMnist(const FashionMnistOptions& options = {});

  // The two files that were read (with ".gz" where that was the one found).
  const std::string& images_path() const { return images_path_; }
  const std::string& labels_path() const { return labels_path_; }

 private:
  struct Loaded;
  explicit FashionMnist(Loaded loaded);

  std::string images_path_;
  std::string labels_path_;
};

}  // namespace datapar
