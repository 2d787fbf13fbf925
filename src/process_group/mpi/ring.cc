// See ring.h.
//
// Note [Ring all-reduce]
// Open MPI's MPI_Iallreduce allocates a temporary buffer as large as the tensor on every
// call; past glibc's mmap threshold that is fresh memory each time, and page-faulting it in
// costs about as much as moving the data. With 2 processes (docs/benchmarks.md, one run):
// 16 MiB 17.3 ms with MPI_Iallreduce, 20.7 ms with blocking MPI_Allreduce, 6.8 ms here;
// 64 MiB 95, 121 and 41 ms. Here the buffer is cut into size() parts and, as in NCCL and
// Gloo, the parts go around the ring twice:
//   1. reduce-scatter, steps s = 0 .. n-2: send part (rank - s) to the next rank, receive
//      part (rank - s - 1) from the previous one and reduce it into ours. Afterwards this
//      rank holds part (rank + 1) fully reduced;
//   2. all-gather, steps s = 0 .. n-2: send part (rank + 1 - s), receive part (rank - s)
//      straight into place.
// Each rank moves 2 (n-1)/n of the buffer, the least an all-reduce can. Received data for
// a reduction arrives in segments of kSegmentBytes in a reused scratch buffer that stays in
// cache, two in flight, so receiving segment k+1 overlaps reducing segment k. Within one
// machine Open MPI moves each message with a single copy (CMA) between the processes.
#include "process_group/mpi/ring.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "datapar/error.h"
#include "process_group/mpi/types.h"

namespace datapar::detail::mpi {
namespace {

constexpr int64_t kSegmentBytes = 256 << 10;

int mod(int a, int n) { return ((a % n) + n) % n; }

// Waits for every request in order; false at the deadline.
bool wait_all(std::vector<MPI_Request>& requests, Clock::time_point deadline, const std::string& what) {
  for (MPI_Request& request : requests) {
    if (!wait(request, deadline, what)) return false;
  }
  return true;
}

}  // namespace

Ring::Ring(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

bool Ring::all_reduce(at::Tensor& buffer, ReduceOp op, Clock::time_point deadline, const std::string& what) {
  DATAPAR_INTERNAL_ASSERT(buffer.is_contiguous() && buffer.dim() == 1);
  const int64_t segment = std::max<int64_t>(1, kSegmentBytes / static_cast<int64_t>(buffer.element_size()));
  if (!scratch_.defined() || scratch_.scalar_type() != buffer.scalar_type()) {
    scratch_ = at::empty({2 * segment}, buffer.options());
  }
  const int n = size_;
  for (int s = 0; s < n - 1; ++s) {  // 1. reduce-scatter
    if (!exchange(buffer, mod(rank_ - s, n), mod(rank_ - s - 1, n), true, op, deadline, what)) return false;
  }
  for (int s = 0; s < n - 1; ++s) {  // 2. all-gather
    if (!exchange(buffer, mod(rank_ + 1 - s, n), mod(rank_ - s, n), false, op, deadline, what)) return false;
  }
  return true;
}

bool Ring::exchange(at::Tensor& buffer, int send, int receive, bool reduce, ReduceOp op, Clock::time_point deadline,
                    const std::string& what) {
  const int n = size_;
  const int64_t total = buffer.numel();
  const auto begin = [&](int part) { return total * part / n; };  // parts: [begin(p), begin(p + 1))
  const int64_t element = static_cast<int64_t>(buffer.element_size());
  char* data = static_cast<char*>(buffer.data_ptr());
  const MPI_Datatype type = reduce_type(buffer);
  const int next = (rank_ + 1) % n;
  const int previous = (rank_ + n - 1) % n;
  // A reduced part travels in segments (the receiver's scratch holds two); a gathered one whole.
  const int64_t segment = reduce ? scratch_.numel() / 2 : std::max<int64_t>(1, total);

  std::vector<MPI_Request> sends;
  for (int64_t at = begin(send); at < begin(send + 1); at += segment) {
    const int count = static_cast<int>(std::min(segment, begin(send + 1) - at));
    sends.emplace_back();
    check(MPI_Isend(data + at * element, count, type, next, 0, comm_, &sends.back()), what);
  }
  const int64_t first = begin(receive), end = begin(receive + 1);
  if (!reduce) {
    MPI_Request request;
    check(MPI_Irecv(data + first * element, static_cast<int>(end - first), type, previous, 0, comm_, &request), what);
    return wait(request, deadline, what) && wait_all(sends, deadline, what);
  }
  char* slots = static_cast<char*>(scratch_.data_ptr());
  const int64_t segments = (end - first + segment - 1) / segment;
  MPI_Request slot_request[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  const auto post = [&](int64_t k) {  // receive segment k into slot k % 2
    const int count = static_cast<int>(std::min(segment, end - first - k * segment));
    check(MPI_Irecv(slots + (k % 2) * segment * element, count, type, previous, 0, comm_, &slot_request[k % 2]),
          what);
  };
  for (int64_t k = 0; k < std::min<int64_t>(2, segments); ++k) post(k);
  for (int64_t k = 0; k < segments; ++k) {
    if (!wait(slot_request[k % 2], deadline, what)) return false;
    const int64_t at = first + k * segment;
    reduce_into(data + at * element, slots + (k % 2) * segment * element, std::min(segment, end - at),
                buffer.scalar_type(), op);
    if (k + 2 < segments) post(k + 2);
  }
  return wait_all(sends, deadline, what);
}

}  // namespace datapar::detail::mpi
