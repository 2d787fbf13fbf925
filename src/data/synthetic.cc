// Synthetic images. See synthetic.h.
#include "datapar/data/synthetic.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "datapar/error.h"

namespace datapar {

TensorDataset make_synthetic_images(const SyntheticImagesOptions& options) {
  DATAPAR_CHECK(options.size >= 0, "make_synthetic_images: size is ", options.size, "; it must be >= 0.");
  DATAPAR_CHECK(options.num_classes >= 1, "make_synthetic_images: num_classes is ", options.num_classes,
                "; it must be >= 1.");
  DATAPAR_CHECK(options.channels >= 1 && options.height >= 1 && options.width >= 1,
                "make_synthetic_images: image shape ", options.channels, "x", options.height, "x", options.width,
                " has a non-positive dimension.");
  DATAPAR_CHECK(options.noise >= 0, "make_synthetic_images: noise is ", options.noise, "; it must be >= 0.");

  // Two generators: prototypes depend on the seed only, so train and test share the task;
  // samples on the seed and the split. The odd constant keeps the sample streams of
  // neighbouring seeds apart from each other's prototype stream.
  at::Generator task = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  at::Generator draws = at::make_generator<at::CPUGeneratorImpl>(
      options.seed * 0x9E3779B97F4A7C15ull + (options.train ? 1 : 2));

  const at::TensorOptions f32(at::kFloat);
  // prototypes: (classes, C, H, W) in [0, 1], so that classes differ pixel by pixel.
  const at::Tensor prototypes =
      at::rand({options.num_classes, options.channels, options.height, options.width}, task, f32);
  // Balanced labels in random order: 0, 1, ..., classes-1, 0, 1, ... shuffled.
  const at::Tensor labels = at::arange(options.size, at::TensorOptions(at::kLong))
                                .remainder(options.num_classes)
                                .index_select(0, at::randperm(options.size, draws, at::TensorOptions(at::kLong)));
  at::Tensor images = prototypes.index_select(0, labels);  // (N, C, H, W)
  images.add_(at::randn(images.sizes(), draws, f32), options.noise).clamp_(0.0, 1.0);
  return TensorDataset(images, labels);
}

}  // namespace datapar
