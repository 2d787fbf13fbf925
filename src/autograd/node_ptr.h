// How libtorch owns autograd nodes, named once for every libtorch datapar supports.
//
// Up to some 2.x release a Node is held by std::shared_ptr<Node> and must be deleted through
// torch::autograd::deleteNode (which frees a long graph without deep recursion); later ones
// hold it by c10::intrusive_ptr<Node> (PyTorch PR #181782) and have no deleteNode. The type is
// taken from what libtorch itself returns, so no version number has to be guessed.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace datapar::detail {

using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

template <class P>
inline constexpr bool kNodesAreSharedPtrs = false;
template <class T>
inline constexpr bool kNodesAreSharedPtrs<std::shared_ptr<T>> = true;

// A new node of type T (derived from torch::autograd::Node), owned the way libtorch owns nodes.
template <class T, class... Args>
auto make_node(Args&&... args) {
  if constexpr (kNodesAreSharedPtrs<NodePtr>) {
    // deleteNode is found by argument-dependent lookup (T derives from torch::autograd::Node),
    // so the name is looked up only where this branch is compiled.
    return std::shared_ptr<T>(new T(std::forward<Args>(args)...), [](T* node) { deleteNode(node); });
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

}  // namespace datapar::detail
