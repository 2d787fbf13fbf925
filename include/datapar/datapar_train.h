// datapar's training toolkit (datapar::datapar_train, which links datapar::datapar): the
// core's umbrella plus data (samplers, datasets, the prefetching loader), checkpoints,
// metrics and plots, and the example models.
#pragma once

#include "datapar/data/dataset.h"
#include "datapar/data/distributed_sampler.h"
#include "datapar/data/fashion_mnist.h"
#include "datapar/data/idx_file.h"
#include "datapar/data/loader.h"
#include "datapar/data/synthetic.h"
#include "datapar/datapar.h"
#include "datapar/models/lenet.h"
#include "datapar/models/mlp.h"
#include "datapar/models/resnet18.h"
#include "datapar/train/checkpoint.h"
#include "datapar/train/fsdp_checkpoint.h"
#include "datapar/train/metrics.h"
#include "datapar/train/plot.h"
#include "datapar/train/rng_state.h"
