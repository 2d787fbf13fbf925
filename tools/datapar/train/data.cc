// A run's data. See data.h.
#include "data.h"

#include "datapar/data/fashion_mnist.h"
#include "datapar/data/synthetic.h"

namespace datapar::tools {
namespace {

// The first `limit` samples (all when limit is 0 or larger than the set).
std::shared_ptr<TensorDataset> take(const TensorDataset& d, int64_t limit) {
  if (limit <= 0 || limit >= d.size()) return std::make_shared<TensorDataset>(d.data(), d.target());
  return std::make_shared<TensorDataset>(d.data().narrow(0, 0, limit), d.target().narrow(0, 0, limit));
}

}  // namespace

Data load_data(const TrainPlan& plan) {
  const TrainOptions& o = plan.options;
  if (plan.data_dir.empty()) {  // synthetic: the subset's sizes, one task per seed
    SyntheticImagesOptions s;
    s.seed = o.seed;
    s.size = 6000;
    const TensorDataset train = make_synthetic_images(s);
    s.size = 1000;
    s.train = false;
    return {take(train, o.limit), take(make_synthetic_images(s), o.limit)};
  }
  FashionMnistOptions f;
  f.root = plan.data_dir;
  f.limit = o.limit;  // read no more than is used: memory follows --limit, not the files
  const FashionMnist train(f);
  f.train = false;
  return {take(train, o.limit), take(FashionMnist(f), o.limit)};
}

}  // namespace datapar::tools
