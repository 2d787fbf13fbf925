// parallel_apply: run replica i on input i, on devices[i]'s thread, all at once.
//
// Only as many replicas run as there are inputs (a batch of 2 rows on 4 devices runs 2).
// When autograd is recording, the outputs of all replicas hang off one autograd node; its
// backward runs every replica's backward on that replica's own thread, concurrently, and
// sums the replicas' parameter gradients into the master's parameters. (libtorch would
// otherwise run all CPU backward work on the one thread that called backward().)
// An exception in any replica is rethrown in the caller as datapar::Error naming the device.
// Double backward (create_graph=true) through a parallel section is not supported.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "datapar/devices.h"
#include "datapar/parallel/replicate.h"

namespace datapar {
namespace detail {

// forward(i, input) runs replica i on its (already scattered) input.
using ReplicaForward = std::function<c10::IValue(size_t replica, const c10::IValue& input)>;

// Seconds each replica kept its device busy in one step, for DataParallel's balancing
// (load_balancer.h): forward written by parallel_apply, backward by the parallel section's
// backward, each by the replica's own thread once its device finished (CUDA: the stream
// synchronised). -1: not run (yet). A backward through an older step's section, whose
// generation is past, writes nothing.
struct ReplicaTimes {
  std::vector<double> forward;
  std::vector<double> backward;
  std::atomic<uint64_t> generation{0};
};

// Refreshes the replicas, then runs forward(i, inputs[i]) for i < inputs.size() as
// described above; `times`, when given, is reset and filled for this step.
// REQUIRES: 1 <= inputs.size() <= replicas.size().
std::vector<c10::IValue> parallel_apply(ReplicaSet& replicas, const ReplicaForward& forward,
                                        const std::vector<c10::IValue>& inputs,
                                        const std::shared_ptr<ReplicaTimes>& times = nullptr);

// Checks that the caller's device list is the replicas' (a prefix of it is fine).
void check_parallel_apply_devices(const ReplicaSet& replicas, size_t num_inputs,
                                  const std::vector<Device>& devices);

}  // namespace detail

// Runs replicas[i]->forward(inputs[i]) on devices[i] for every input, concurrently.
// `devices` must be the devices the replicas were made for (or a prefix as long as inputs).
// Returns one output per input, in order.
template <typename ModuleImpl>
auto parallel_apply(const Replicas<ModuleImpl>& replicas, const std::vector<at::Tensor>& inputs,
                    const std::vector<Device>& devices) {
  using Output = std::decay_t<decltype(std::declval<ModuleImpl&>().forward(std::declval<at::Tensor>()))>;
  detail::check_parallel_apply_devices(replicas.set(), inputs.size(), devices);
  std::vector<c10::IValue> boxed(inputs.begin(), inputs.end());
  auto outputs = detail::parallel_apply(
      replicas.set(),
      [&](size_t i, const c10::IValue& input) { return c10::IValue(replicas[i]->forward(input.toTensor())); },
      boxed);
  std::vector<Output> typed;
  typed.reserve(outputs.size());
  for (c10::IValue& output : outputs) typed.push_back(std::move(output).to<Output>());
  return typed;
}

// The general form: inputs of any nesting (see scatter), and `call(replica, input)` decides
// how a replica consumes its input and returns an IValue.
template <typename ModuleImpl, typename Call>
std::vector<c10::IValue> parallel_apply(const Replicas<ModuleImpl>& replicas,
                                        const std::vector<c10::IValue>& inputs,
                                        const std::vector<Device>& devices, Call&& call) {
  detail::check_parallel_apply_devices(replicas.set(), inputs.size(), devices);
  return detail::parallel_apply(
      replicas.set(),
      [&](size_t i, const c10::IValue& input) { return c10::IValue(call(*replicas[i], input)); }, inputs);
}

}  // namespace datapar
