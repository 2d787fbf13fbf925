// datapar bench fsdp: the cost of fully sharding a model (step time against DDP's on the same
// model, batch and threads) and what it saves (each rank's parameters, gradients and
// optimizer state).
#pragma once

#include <string>

namespace datapar::tools {

struct BenchFsdpOptions {
  std::string model = "mlp";  // mlp | mlp-large (784-4096-4096-4096-10) | lenet | resnet18
  int nproc = 2;
  int batch = 0;        // per rank; 0: the model's default (mlp 64, lenet 128, resnet18 32)
  std::string backend;  // gloo or mpi; empty: job_backend() (local_job.h)
  int steps = 0;        // timed steps per round; 0: the model's default
  int warmup = 5;
  int rounds = 5;                  // DDP and FSDP timed in turn, this many times each
  int threads = 1;                 // intra-op threads per process
  std::string optimizer = "adam";  // adam (lr 1e-3) or sgd (lr 0.01)
  bool reshard = true;             // FsdpOptions::reshard_after_forward
  bool fault_tolerant = false;      // also time ft::FaultTolerantFsdp (gloo)
  bool hsdp = false;                // also time hybrid sharding (FsdpOptions::replicate_group)
  int shard_size = 0;               // hsdp: ranks per shard group; 0: a machine's (LOCAL_WORLD_SIZE)
};

// Each rank, all at once: the model under DDP and under FSDP (each layer with parameters a
// unit, a residual block whole), and HSDP and fault-tolerant FSDP if asked, timed in
// alternating rounds. Rank 0 prints the median step times, their ratio, the bytes per rank
// of each (and of ZeRO-1, computed from DDP's), under --hsdp on ranks that span machines the
// bytes each sends over the machines' links per step (link_bytes.h), and last
// `samples/s: X` (FSDP's).
int bench_fsdp(const BenchFsdpOptions& options);

}  // namespace datapar::tools
