// See process_group.h: the public operations check their arguments and name the operation
// here, once, for every backend; the backends' do_* only move bytes.
#include "datapar/process_group/process_group.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "datapar/error.h"
#include "datapar/process_group/flight_recorder.h"
#include "process_group/flight_recorder.h"
#include "process_group/stall_inspector.h"
#include "process_group/tensor_description.h"
#include "collectives/aborted.h"
#include "process_group/work_completion.h"
#include "trace/recorder.h"

namespace datapar {

using detail::str_cat;

namespace {

void check_root(int root, int size, const char* what) {
  DATAPAR_CHECK(root >= 0 && root < size, what, ": root ", root, " is outside [0, ", size, ").");
}

// kAvg only for floating-point tensors. `plural`: the message speaks of a list.
void check_avg(ReduceOp op, const at::Tensor& tensor, const char* what, bool plural = false) {
  DATAPAR_CHECK(op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type()), what, ": avg needs ",
                plural ? "floating-point tensors" : "a floating-point tensor", ", not ", tensor.scalar_type(), ".");
}

void check_peer(int peer, int rank, int size, int tag, const char* what) {
  DATAPAR_CHECK(peer >= 0 && peer < size, what, ": peer rank ", peer, " is outside [0, ", size, ").");
  DATAPAR_CHECK(peer != rank, what, ": rank ", rank, " is the peer itself; copy the tensor instead.");
  DATAPAR_CHECK(tag >= 0, what, ": tag ", tag, " must not be negative.");
}

}  // namespace

ProcessGroup::ProcessGroup(int rank, int size, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), timeout_(timeout) {
  DATAPAR_CHECK(size >= 1, "ProcessGroup: size ", size, " must be at least 1.");
  DATAPAR_CHECK(rank >= 0 && rank < size, "ProcessGroup: rank ", rank, " is outside [0, ", size, ").");
  DATAPAR_CHECK(timeout.count() > 0, "ProcessGroup: the timeout must be positive, not ", timeout.count(), " ms.");
}

std::string ProcessGroup::describe(const std::string& what) const {
  return str_cat(what, " on rank ", rank(), " of ", size(), " (", label(), ")");
}

void ProcessGroup::abort() {
  if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
  std::vector<std::weak_ptr<Work>> in_flight;
  {
    const std::lock_guard<std::mutex> lock(in_flight_mutex_);
    in_flight.swap(in_flight_);
  }
  for (const std::weak_ptr<Work>& weak : in_flight) {
    if (const std::shared_ptr<Work> work = weak.lock()) {
      detail::WorkCompletion::fail(*work, std::make_exception_ptr(CommError(detail::aborted_message(work->what()))));
    }
  }
  do_abort();
}

template <typename Start, typename Tensors>
std::shared_ptr<Work> ProcessGroup::start(const std::string& what, Start&& start_operation, Tensors&& tensors,
                                          bool collective) {
  if (aborted()) throw CommError(detail::aborted_message(describe(what)));
  // The flight recorder's record, and DATAPAR_DISTRIBUTED_DEBUG=DETAIL's check: collectives
  // only (a point-to-point operation has no number every rank shares).
  std::shared_ptr<detail::CollectiveRecord> record;
  if (collective) {
    std::call_once(recorder_once_, [this] {
      if (detail::is_internal(this)) return;  // the group it works for records
      recorder_ = detail::make_flight_recorder(backend(), rank(), size());
      if (recorder_ && !name_.empty()) recorder_->set_name(name_);
    });
    const bool checked = collectives_checked() && !detail::is_internal(this);
    if (recorder_ || checked) {
      std::string described = tensors();
      if (checked) check_same_call(what, described);
      if (recorder_) record = recorder_->issue(what, std::move(described), trace::detail::collective_site());
    }
  }
  std::shared_ptr<Work> work;
  try {
    work = start_operation();
  } catch (...) {
    const std::exception_ptr error = detail::as_datapar_error(describe(what), std::current_exception());
    if (record) record->end(false, "not started");
    std::rethrow_exception(error);
  }
  if (record) detail::WorkCompletion::attach(*work, std::move(record));
  // The group's own timeout error names who is missing: a waiter gives it time to come first.
  detail::WorkCompletion::limit(*work, timeout_ + std::min(timeout_, kWaitGrace));
  if (collective && stall_inspector_) stall_inspector_->issued(work);
  {
    const std::lock_guard<std::mutex> lock(in_flight_mutex_);
    if (in_flight_.size() >= prune_at_) {
      in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                      [](const std::weak_ptr<Work>& w) {
                                        const std::shared_ptr<Work> work = w.lock();
                                        return !work || work->is_completed();
                                      }),
                       in_flight_.end());
      prune_at_ = std::max<size_t>(64, 2 * in_flight_.size());
    }
    in_flight_.push_back(work);
  }
  // An abort that came while this was issued: the Work fails like the others.
  if (aborted()) {
    detail::WorkCompletion::fail(*work, std::make_exception_ptr(CommError(detail::aborted_message(work->what()))));
  }
  return work;
}

void ProcessGroup::inspect_stalls(std::shared_ptr<Store> store, std::chrono::milliseconds warn_after) {
  DATAPAR_CHECK(stall_inspector_ == nullptr, "inspect_stalls: this group's stalls are inspected already; call "
                "set_stall_warning() to change the wait.");
  stall_inspector_ = std::make_shared<detail::StallInspector>(std::move(store), rank(), size(), warn_after);
}

std::string ProcessGroup::ranks_behind() const {
  return stall_inspector_ ? stall_inspector_->ranks_behind() : "";
}

void ProcessGroup::set_name(const std::string& name) {
  name_ = name;
  if (recorder_) recorder_->set_name(name);
}

void ProcessGroup::set_stall_warning(std::chrono::milliseconds warn_after) {
  DATAPAR_CHECK(stall_inspector_ != nullptr, "set_stall_warning: this group has no stall inspector (it was made ",
                "without a store); call inspect_stalls() first.");
  stall_inspector_->set_warn_after(warn_after);
}

void ProcessGroup::check_tensor(const at::Tensor& tensor, const char* what) const {
  DATAPAR_CHECK(tensor.defined(), what, ": the tensor is undefined.");
  const c10::Device mine = device();
  if (mine.is_cpu()) {
    DATAPAR_CHECK(tensor.device().is_cpu() || (tensor.is_cuda() && takes_cuda_tensors()), what, ": the ", backend(),
                  " backend takes CPU tensors, not ", tensor.device(), ". Use the nccl backend for CUDA tensors.");
  } else {
    DATAPAR_CHECK(tensor.device() == mine, what, ": the ", backend(), " backend takes tensors on this rank's device ",
                  mine, ", not ", tensor.device(), ". Use the gloo or mpi backend for CPU tensors.");
  }
  DATAPAR_CHECK(tensor.layout() == at::kStrided, what, ": the ", backend(), " backend takes dense tensors, not ",
                tensor.layout(), " ones.");
}

void ProcessGroup::check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* what,
                              const char* name) const {
  DATAPAR_CHECK(static_cast<int>(list.size()) == size(), what, ": ", list.size(), " ", name, " for ", size(),
                " processes; give one per process.");
  const c10::Device mine = like.device();  // checked by check_tensor
  for (size_t i = 0; i < list.size(); ++i) {
    const at::Tensor& t = list[i];
    DATAPAR_CHECK(t.defined() && t.device() == mine && t.layout() == at::kStrided && t.sizes() == like.sizes() &&
                      t.scalar_type() == like.scalar_type(),
                  what, ": ", name, "[", i, "] must be a ", mine.is_cpu() ? "CPU" : mine.str(), " tensor of shape ",
                  like.sizes(), " and type ", like.scalar_type(), ", not ",
                  t.defined() ? str_cat(t.device(), " ", t.sizes(), " ", t.scalar_type()) : std::string("undefined"),
                  ".");
  }
}

std::shared_ptr<Work> ProcessGroup::all_reduce(at::Tensor tensor, ReduceOp op) {
  check_tensor(tensor, "all_reduce");
  check_avg(op, tensor, "all_reduce");
  const std::string what = str_cat("all_reduce(", to_string(op), ")");
  return start(what, [&] { return do_all_reduce(what, std::move(tensor), op); },
               [&] { return detail::describe_tensor(tensor); });
}

std::shared_ptr<Work> ProcessGroup::broadcast(at::Tensor tensor, int root) {
  check_tensor(tensor, "broadcast");
  check_root(root, size(), "broadcast");
  const std::string what = str_cat("broadcast(root ", root, ")");
  return start(what, [&] { return do_broadcast(what, std::move(tensor), root); },
               [&] { return detail::describe_tensor(tensor); });
}

std::shared_ptr<Work> ProcessGroup::reduce(at::Tensor tensor, int root, ReduceOp op) {
  check_tensor(tensor, "reduce");
  check_root(root, size(), "reduce");
  check_avg(op, tensor, "reduce");
  const std::string what = str_cat("reduce(", to_string(op), ", root ", root, ")");
  return start(what, [&] { return do_reduce(what, std::move(tensor), root, op); },
               [&] { return detail::describe_tensor(tensor); });
}

std::shared_ptr<Work> ProcessGroup::all_gather(std::vector<at::Tensor> outputs, at::Tensor input) {
  check_tensor(input, "all_gather");
  check_list(outputs, input, "all_gather", "outputs");
  const std::string what = "all_gather";
  return start(what, [&] { return do_all_gather(what, std::move(outputs), std::move(input)); },
               [&] { return detail::describe_tensor(input); });
}

std::shared_ptr<Work> ProcessGroup::gather(std::vector<at::Tensor> outputs, at::Tensor input, int root) {
  check_tensor(input, "gather");
  check_root(root, size(), "gather");
  if (rank() == root) {
    check_list(outputs, input, "gather", "outputs on the root");
  } else {
    outputs.clear();
  }
  const std::string what = str_cat("gather(root ", root, ")");
  return start(what, [&] { return do_gather(what, std::move(outputs), std::move(input), root); },
               [&] { return detail::describe_tensor(input); });
}

std::shared_ptr<Work> ProcessGroup::scatter(at::Tensor output, std::vector<at::Tensor> inputs, int root) {
  check_tensor(output, "scatter");
  check_root(root, size(), "scatter");
  if (rank() == root) {
    check_list(inputs, output, "scatter", "inputs on the root");
  } else {
    inputs.clear();
  }
  const std::string what = str_cat("scatter(root ", root, ")");
  return start(what, [&] { return do_scatter(what, std::move(output), std::move(inputs), root); },
               [&] { return detail::describe_tensor(output); });
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter(at::Tensor output, std::vector<at::Tensor> inputs, ReduceOp op) {
  check_tensor(output, "reduce_scatter");
  check_list(inputs, output, "reduce_scatter", "inputs");
  check_avg(op, output, "reduce_scatter");
  const std::string what = str_cat("reduce_scatter(", to_string(op), ")");
  return start(what, [&] { return do_reduce_scatter(what, std::move(output), std::move(inputs), op); },
               [&] { return detail::describe_tensor(output); });
}

std::shared_ptr<Work> ProcessGroup::all_to_all_single(at::Tensor output, at::Tensor input) {
  check_tensor(input, "all_to_all_single");
  check_tensor(output, "all_to_all_single");
  DATAPAR_CHECK(input.sizes() == output.sizes() && input.scalar_type() == output.scalar_type(),
                "all_to_all_single: output ", output.sizes(), " ", output.scalar_type(), " must match input ",
                input.sizes(), " ", input.scalar_type(), ".");
  DATAPAR_CHECK(input.dim() >= 1 && input.size(0) % size() == 0, "all_to_all_single: dim 0 of the input (",
                input.dim() ? input.size(0) : 0, ") must split into ", size(), " equal chunks.");
  const std::string what = "all_to_all_single";
  return start(what, [&] { return do_all_to_all_single(what, std::move(output), std::move(input)); },
               [&] { return detail::describe_tensor(input); });
}

std::shared_ptr<Work> ProcessGroup::barrier() {
  const std::string what = "barrier";
  return start(what, [&] { return do_barrier(what); }, [] { return std::string(); });
}

std::shared_ptr<Work> ProcessGroup::all_reduce_coalesced(std::vector<at::Tensor> tensors, ReduceOp op) {
  for (const at::Tensor& t : tensors) {
    check_tensor(t, "all_reduce_coalesced");
    check_avg(op, t, "all_reduce_coalesced", /*plural=*/true);
  }
  const std::string what = str_cat("all_reduce_coalesced(", to_string(op), ", ", tensors.size(), " tensors)");
  return start(what, [&] { return do_all_reduce_coalesced(what, std::move(tensors), op); },
               [&] { return detail::describe_tensors(tensors); });
}

std::shared_ptr<Work> ProcessGroup::broadcast_coalesced(std::vector<at::Tensor> tensors, int root) {
  for (const at::Tensor& t : tensors) check_tensor(t, "broadcast_coalesced");
  check_root(root, size(), "broadcast_coalesced");
  const std::string what = str_cat("broadcast_coalesced(root ", root, ", ", tensors.size(), " tensors)");
  return start(what, [&] { return do_broadcast_coalesced(what, std::move(tensors), root); },
               [&] { return detail::describe_tensors(tensors); });
}

std::shared_ptr<Work> ProcessGroup::send(at::Tensor tensor, int dst, int tag) {
  check_tensor(tensor, "send");
  check_peer(dst, rank(), size(), tag, "send");
  const std::string what = str_cat("send(to ", dst, ", tag ", tag, ")");
  return start(what, [&] { return do_send(what, std::move(tensor), dst, tag); },
               [&] { return detail::describe_tensor(tensor); }, /*collective=*/false);
}

std::shared_ptr<Work> ProcessGroup::recv(at::Tensor tensor, int src, int tag) {
  check_tensor(tensor, "recv");
  check_peer(src, rank(), size(), tag, "recv");
  const std::string what = str_cat("recv(from ", src, ", tag ", tag, ")");
  return start(what, [&] { return do_recv(what, std::move(tensor), src, tag); },
               [&] { return detail::describe_tensor(tensor); }, /*collective=*/false);
}

}  // namespace datapar
