// datapar bench ddp: throughput of DDP training steps, with the measurements that explain it.
#pragma once

#include <string>

namespace datapar::tools {

struct BenchDdpOptions {
  std::string model = "mlp";  // mlp | lenet | resnet18
  int nproc = 2;
  int batch = 0;              // per rank; 0: the model's default (mlp 64, lenet 128, resnet18 32)
  std::string backend;  // gloo, mpi or nccl; empty: job_backend() (local_job.h)
  int steps = 0;              // timed steps; 0: the model's default
  int warmup = 5;
  int threads = 1;            // intra-op threads per process
  bool gradient_as_bucket_view = false;  // DdpOptions::gradient_as_bucket_view
  std::string trace;          // also time DDP steps with the timeline on, and write it here
  std::string optimizer = "sgd";  // sgd (lr 0.01) or adam (lr 1e-3), in every phase
  bool zero = false;          // also time DDP steps under ZeroRedundancyOptimizer, with its state per rank,
                              // its parameters as bucket views and in their own memory by turns
  bool fault_tolerant = false;  // also time ft::FaultTolerantDdp's steps against plain DDP's (gloo), by turns
  std::string comm_hook;        // also time DDP steps with this hook (datapar train's --comm-hook), by turns
  int64_t sync_every = 0;       // also time local SGD / DiLoCo rounds of this many steps against DDP, by turns
  int64_t fragments = 1;        // --sync-every: Streaming DiLoCo's fragments
  std::string outer_dtype = "float32";  // --sync-every: the exchange's dtype
  std::string outer_optimizer = "nesterov";  // --sync-every: nesterov (DiLoCo) or replace (local SGD)
};

// Each rank, all at once: `steps` local steps with no synchronisation (the ceiling), then
// `steps` DDP steps, then the all-reduces of the gradient buckets alone. Rank 0 prints the
// times, the share of all-reduce time hidden behind backward, each training phase's step
// parts and CPU time, and last `samples/s: X`. With a trace path: then DDP steps with the
// timeline (trace.h) off and on in turn, six rounds, and the cost of recording it.
int bench_ddp(const BenchDdpOptions& options);

}  // namespace datapar::tools
