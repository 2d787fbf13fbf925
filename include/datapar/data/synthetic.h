// Synthetic images with the shapes of Fashion-MNIST, for tests and benchmarks that must
// not depend on files: (N, 1, 28, 28) float in [0, 1] and (N,) int64 labels.
//
// Each class has a fixed random prototype image; a sample is its class's prototype plus
// Gaussian noise, clipped to [0, 1]. So the labels are learnable (a linear model separates
// the classes well at the default noise) and training makes visible progress, unlike
// random labels. Everything is drawn from `seed`: the same options give the same tensors
// on every machine and rank. The train and test sets of one seed share the prototypes
// (the same task) but draw different samples.
#pragma once

#include <cstdint>

#include "datapar/data/dataset.h"

namespace datapar {

struct SyntheticImagesOptions {
  int64_t size = 6000;       // samples
  int64_t num_classes = 10;  // labels 0 .. num_classes-1, balanced (size / num_classes each, +1 for the first ones)
  int64_t channels = 1;
  int64_t height = 28;
  int64_t width = 28;
  uint64_t seed = 0;         // the task (prototypes) and the samples
  bool train = true;         // train and test draw different samples of the same task
  double noise = 0.5;        // standard deviation of the per-pixel noise
};

// Builds the dataset. Throws InvalidArgumentError for size < 0, num_classes < 1,
// non-positive image dimensions or negative noise.
TensorDataset make_synthetic_images(const SyntheticImagesOptions& options = {});

}  // namespace datapar
