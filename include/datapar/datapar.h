// datapar: data-parallel training for C++ on libtorch. The umbrella header of the core
// library (datapar::datapar): devices, DataParallel, rendezvous, process groups, DDP.
// The training toolkit (data, checkpoints, metrics, models) is datapar::datapar_train, whose
// umbrella is datapar/datapar_train.h.
#pragma once

#include "datapar/config.h"
#include "datapar/cpu_allocator.h"
#include "datapar/ddp/comm_hook.h"
#include "datapar/ddp/communication_stats.h"
#include "datapar/ddp/distributed_data_parallel.h"
#include "datapar/ddp/sync_batch_norm.h"
#include "datapar/ddp/zero_redundancy_optimizer.h"
#include "datapar/devices.h"
#include "datapar/distributed.h"
#include "datapar/environment.h"
#include "datapar/error.h"
#include "datapar/parallel/chunk_sizes.h"
#include "datapar/parallel/data_parallel.h"
#include "datapar/parallel/parallel_apply.h"
#include "datapar/parallel/replicate.h"
#include "datapar/parallel/scatter_gather.h"
#include "datapar/process_group/metadata.h"
#include "datapar/process_group/process_group.h"
#include "datapar/rendezvous/file_store.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/rendezvous/job_config.h"
#include "datapar/rendezvous/prefix_store.h"
#include "datapar/rendezvous/reserved_port.h"
#include "datapar/rendezvous/tcp_store.h"
#include "datapar/state_dict.h"
#include "datapar/timeout.h"
#include "datapar/trace.h"
#include "datapar/warning.h"
