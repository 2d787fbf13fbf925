// A run's train and test sets: the Fashion-MNIST files of --data (the shipped subset by
// default), or synthetic images of the same sizes, each cut to --limit.
#pragma once

#include <memory>

#include "../train.h"
#include "datapar/data/dataset.h"

namespace datapar::tools {

struct Data {
  std::shared_ptr<TensorDataset> train, test;
};

// Reads (and checks) every file now: a missing or damaged one fails here, naming it.
Data load_data(const TrainPlan& plan);

}  // namespace datapar::tools
