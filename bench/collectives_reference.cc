// The floors datapar's collectives are measured against, timed as `datapar bench
// collectives` times them (per size: warm-up runs, then runs each after a barrier, rank
// 0's median; all_reduce of float32 in place):
//   - plain MPI: MPI_Allreduce / MPI_Bcast / MPI_Allgather called on the main thread, as
//     an MPI program would (Open MPI's tuned algorithms); with --nonblocking, the
//     MPI_I* call polled with MPI_Test, as datapar's MPI backend does for small buffers
//     but on the calling thread, which separates the cost of polling from that of
//     datapar's threads;
//   - memcpy: one process copying `size` bytes once, what one pass over the data costs.
// Run it under mpirun: mpirun -np 2 build/bin/collectives_reference --sizes 4KiB,1MiB
#include <CLI/CLI.hpp>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // MPI's C API only
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_format.h"

using datapar::tools::human_bytes;
using datapar::tools::median;

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int64_t> parse_sizes(const std::string& list) {
  std::vector<int64_t> sizes;
  size_t start = 0;
  while (start < list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string item = list.substr(start, comma - start);
    size_t digits = 0;
    while (digits < item.size() && item[digits] >= '0' && item[digits] <= '9') ++digits;
    const std::string unit = item.substr(digits);
    const int64_t scale = unit == "KiB" ? 1 << 10 : unit == "MiB" ? 1 << 20 : unit == "GiB" ? int64_t{1} << 30 : 1;
    sizes.push_back(std::stoll(item.substr(0, digits)) * scale);
    start = comma + 1;
  }
  return sizes;
}

// Waits for a request the way datapar's MPI backend does in its first phase: MPI_Test in a loop.
void poll(MPI_Request& request) {
  int done = 0;
  while (!done) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Plain MPI and memcpy timings, the floors for datapar bench collectives"};
  std::string op = "all_reduce";
  std::string sizes_text = "4KiB,64KiB,1MiB,4MiB,16MiB,64MiB";
  int iters = 20;
  int warmup = 5;
  bool nonblocking = false;
  app.add_option("--op", op, "all_reduce, broadcast or all_gather (default all_reduce)");
  app.add_option("--sizes", sizes_text, "Bytes per process (default 4KiB..64MiB)");
  app.add_option("--iters", iters, "Timed iterations per size (default 20)");
  app.add_option("--warmup", warmup, "Untimed iterations per size (default 5)");
  app.add_flag("--nonblocking", nonblocking, "MPI_I* polled with MPI_Test instead of the blocking call");
  CLI11_PARSE(app, argc, argv);

  // As datapar's MPI backend initialises MPI: its threading level and, for MPI_I*, its
  // choice of all-reduce algorithm (Note [Non-blocking all-reduce algorithm]).
  if (nonblocking) ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const std::vector<int64_t> sizes = parse_sizes(sizes_text);
  if (rank == 0) {
    std::printf("plain MPI%s: %s, %d processes, %d iterations (median)\n", nonblocking ? " (MPI_I* + MPI_Test)" : "",
                op.c_str(), n, iters);
    std::printf("| size | time (us) | algbw (GB/s) | busbw (GB/s) |\n|---|---|---|---|\n");
  }
  std::vector<float> warm(1024, 1.0f);
  for (int i = 0; i < 20; ++i) MPI_Allreduce(MPI_IN_PLACE, warm.data(), 1024, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  for (int64_t bytes : sizes) {
    const int count = static_cast<int>(std::max<int64_t>(1, bytes / 4));
    std::vector<float> buffer(count, 1.0f);
    std::vector<float> gathered(op == "all_gather" ? static_cast<size_t>(count) * n : 0);
    auto once = [&] {
      MPI_Request request;
      if (op == "all_reduce") {
        if (!nonblocking) return (void)MPI_Allreduce(MPI_IN_PLACE, buffer.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Iallreduce(MPI_IN_PLACE, buffer.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
      } else if (op == "broadcast") {
        if (!nonblocking) return (void)MPI_Bcast(buffer.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        MPI_Ibcast(buffer.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD, &request);
      } else {
        if (!nonblocking) {
          return (void)MPI_Allgather(buffer.data(), count, MPI_FLOAT, gathered.data(), count, MPI_FLOAT, MPI_COMM_WORLD);
        }
        MPI_Iallgather(buffer.data(), count, MPI_FLOAT, gathered.data(), count, MPI_FLOAT, MPI_COMM_WORLD, &request);
      }
      poll(request);
    };
    for (int i = 0; i < warmup; ++i) once();
    std::vector<double> seconds;
    for (int i = 0; i < iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto start = Clock::now();
      once();
      seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    const double t = median(seconds);
    const double moved = static_cast<double>(count) * 4 * (op == "all_gather" ? n : 1);
    const double algbw = moved / t / 1e9;
    const double factor = op == "all_reduce" ? 2.0 * (n - 1) / n : op == "all_gather" ? (n - 1.0) / n : 1.0;
    if (rank == 0) std::printf("| %s | %.1f | %.3f | %.3f |\n", human_bytes(count * 4).c_str(), t * 1e6, algbw, algbw * factor);
  }
  if (rank == 0) {  // memcpy: one process, the others wait in the barrier below
    std::printf("\nmemcpy: one process copying the buffer once, %d iterations (median)\n", iters);
    std::printf("| size | time (us) | GB/s |\n|---|---|---|\n");
    for (int64_t bytes : sizes) {
      std::vector<char> from(bytes, 1), to(bytes, 0);
      std::vector<double> seconds;
      for (int i = 0; i < warmup + iters; ++i) {
        const auto start = Clock::now();
        std::memcpy(to.data(), from.data(), bytes);
        asm volatile("" : : "r"(to.data()) : "memory");  // the copy is used: the compiler keeps it
        if (i >= warmup) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
      const double t = median(seconds);
      std::printf("| %s | %.1f | %.3f |\n", human_bytes(bytes).c_str(), t * 1e6, bytes / t / 1e9);
    }
  }
  std::fflush(stdout);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
