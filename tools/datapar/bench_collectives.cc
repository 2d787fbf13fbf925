// datapar bench collectives. See bench_collectives.h.
//
// First 20 untimed 4 KiB all_reduces for the connections, then for each size: `warmup`
// untimed runs, then `iters` timed ones, each started together (a barrier before it) and
// timed on every rank; the table shows rank 0's median. Bandwidths follow nccl-tests:
// algbw = bytes / time; busbw = algbw * 2(n-1)/n for all_reduce, algbw * (n-1)/n for
// all_gather (bytes = the gathered total), algbw for broadcast.
//
// Tensors live on the group's device (ProcessGroup::device()). On a device backend (nccl)
// Work::wait() only orders the current stream after the operation (work.h), so a timed
// run ends when one element of the result has reached the host, which waits for it; that
// copy adds about 10 us, which shows only at the smallest sizes. Only CPU-build libtorch
// APIs are used here: the tool is built without CUDA too.
#include "bench_collectives.h"

#include <ATen/ATen.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "bench_format.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/rendezvous/init_method.h"
#include "datapar/rendezvous/tcp_store.h"
#include "local_job.h"

namespace datapar::tools {
namespace {

using Clock = std::chrono::steady_clock;

// One rank's part of the benchmark.
int run_rank(const BenchCollectivesOptions& options, const std::string& init_method, int rank, int world) {
  init_process_group(job_backend(options.backend), init_method, rank, world, kDefaultTimeout);
  auto group = default_group();
  const int n = group->size();
  const at::TensorOptions on_device = at::TensorOptions().device(group->device());  // float32
  // Returns once the operations queued before on `result` have completed. wait() already
  // blocked the host on a CPU backend; on a device one, the copy to the host of one element
  // waits for the current stream, which waits for the operation.
  const bool on_gpu = !group->device().is_cpu();
  auto settle = [&](const at::Tensor& result) {
    if (on_gpu && result.numel() > 0) (void)result.reshape({-1}).narrow(0, 0, 1).to(at::kCPU);
  };
  if (rank == 0) {
    std::printf("datapar bench collectives: %s, backend %s, %d processes, %d iterations (median)\n",
                options.op.c_str(), group->backend().c_str(), n, options.iters);
    std::printf("| size | time (us) | algbw (GB/s) | busbw (GB/s) |\n|---|---|---|---|\n");
  }
  {  // Warm the connections up once before any size is timed, so the first row is not an outlier.
    at::Tensor warm = at::ones({1024}, on_device);
    for (int i = 0; i < 20; ++i) group->all_reduce(warm)->wait();
    settle(warm);
  }
  for (int64_t bytes : options.sizes) {
    const int64_t count = std::max<int64_t>(1, bytes / 4);  // float32 elements
    at::Tensor tensor = at::ones({count}, on_device);
    std::vector<at::Tensor> gathered;
    if (options.op == "all_gather") {
      for (int i = 0; i < n; ++i) gathered.push_back(at::empty({count}, on_device));
    }
    const at::Tensor& result = options.op == "all_gather" ? gathered.back() : tensor;
    auto once = [&] {
      if (options.op == "all_reduce") {
        group->all_reduce(tensor)->wait();
      } else if (options.op == "broadcast") {
        group->broadcast(tensor, 0)->wait();
      } else {
        group->all_gather(gathered, tensor)->wait();
      }
      settle(result);
    };
    for (int i = 0; i < options.warmup; ++i) once();
    std::vector<double> seconds;
    for (int i = 0; i < options.iters; ++i) {
      group->barrier()->wait();  // blocks the host on every backend (nccl.h), so ranks start together
      const auto start = Clock::now();
      once();
      seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    const double t = median(seconds);
    const double moved = static_cast<double>(count * 4) * (options.op == "all_gather" ? n : 1);
    const double algbw = moved / t / 1e9;
    const double factor = options.op == "all_reduce" ? 2.0 * (n - 1) / n
                          : options.op == "all_gather" ? static_cast<double>(n - 1) / n
                                                       : 1.0;
    if (rank == 0) {
      std::printf("| %s | %.1f | %.3f | %.3f |\n", human_bytes(count * 4).c_str(), t * 1e6, algbw, algbw * factor);
      std::fflush(stdout);
    }
  }
  destroy_process_group();
  return 0;
}

}  // namespace

std::vector<int64_t> parse_sizes(const std::string& list) {
  std::vector<int64_t> sizes;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    const std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t digits = 0;
    while (digits < item.size() && std::isdigit(static_cast<unsigned char>(item[digits]))) ++digits;
    DATAPAR_CHECK(digits > 0, "--sizes: \"", item, "\" is not a size; write e.g. 4KiB,1MiB,64MiB.");
    const std::string unit = item.substr(digits);
    int64_t scale = 0;
    for (const auto& [name, value] : std::vector<std::pair<std::string, int64_t>>{
             {"", 1}, {"B", 1}, {"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", int64_t{1} << 30},
             {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000}}) {
      if (unit == name) scale = value;
    }
    DATAPAR_CHECK(scale > 0, "--sizes: unknown unit \"", unit, "\" in \"", item, "\"; use B, KiB, MiB or GiB.");
    // Bounded before it is multiplied or allocated: every process holds the tensor (and
    // all_gather n of them).
    constexpr int64_t kLargest = int64_t{16} << 30;
    const std::string number = item.substr(0, digits);
    const bool fits = number.size() <= 12 && std::stoll(number) <= kLargest / scale;
    DATAPAR_CHECK(fits, "--sizes: \"", item, "\" is more than 16 GiB per process; give at most 16GiB.");
    sizes.push_back(std::stoll(number) * scale);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return sizes;
}

int bench_collectives(const BenchCollectivesOptions& given) {
  const BenchCollectivesOptions& options = given;
  DATAPAR_CHECK(options.op == "all_reduce" || options.op == "broadcast" || options.op == "all_gather",
                "--op: \"", options.op, "\" is not one of all_reduce, broadcast, all_gather.");
  DATAPAR_CHECK(options.iters >= 1, "--iters ", options.iters, ": time at least 1 iteration per size.");
  DATAPAR_CHECK(options.warmup >= 0, "--warmup ", options.warmup, ": must not be negative.");
  DATAPAR_CHECK(!options.sizes.empty(), "--sizes: no size given; write e.g. 4KiB,1MiB,64MiB.");
  return run_ranks(
      options.nproc, "datapar bench collectives",
      [&](const std::string& init, int rank, int world) { return run_rank(options, init, rank, world); },
      options.backend);
}

}  // namespace datapar::tools
