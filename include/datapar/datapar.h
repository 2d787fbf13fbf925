// datapar: data-parallel training for C++ on libtorch. The umbrella header.
#pragma once

#include "datapar/config.h"
#include "datapar/cpu_allocator.h"
#include "datapar/devices.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/parallel/chunk_sizes.h"
#include "datapar/parallel/data_parallel.h"
#include "datapar/parallel/parallel_apply.h"
#include "datapar/parallel/replicate.h"
#include "datapar/parallel/scatter_gather.h"
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/file_store.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/rendezvous/prefix_store.h"
#include "datapar/rendezvous/tcp_store.h"
#include "datapar/state_dict.h"
