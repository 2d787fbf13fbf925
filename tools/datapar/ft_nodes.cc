// See ft_nodes.h.
#include "ft_nodes.h"

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "datapar/error.h"
#include "datapar/ft/membership/decider.h"
#include "datapar/ft/membership/membership.h"
#include "datapar/rendezvous/prefix_store.h"
#include "datapar/ft/membership/options.h"

namespace datapar::tools {

namespace {

using detail::str_cat;


// One connection attempt's limit: short, so that a launcher that stops is not held by it.
constexpr std::chrono::seconds kConnectAttempt{2};

}  // namespace

FtNodes::FtNodes(TcpStoreOptions store, const std::string& run, int node_rank, int nnodes,
                 std::chrono::milliseconds interval, std::chrono::milliseconds silent_limit,
                 std::chrono::milliseconds absent_limit)
    : options_(std::move(store)),
      run_(run),
      prefix_("ft/" + run + "/"),
      node_rank_(node_rank),
      nnodes_(nnodes),
      interval_(interval),
      silent_limit_(silent_limit),
      absent_limit_(absent_limit),
      others_(static_cast<size_t>(node_rank == 0 ? nnodes : 0), Node{-1, std::chrono::steady_clock::now(), false}) {
  if (!others_.empty()) others_[0].ended = true;  // this one
  thread_ = std::thread([this] { follow(); });
}

FtNodes::~FtNodes() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string FtNodes::stop_reason() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return stop_reason_;
}

bool FtNodes::training_complete() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return complete_;
}

std::string FtNodes::store_error() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return store_error_;
}

int FtNodes::others_ended() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return others_ended_;
}

bool FtNodes::other_completed() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return other_completed_;
}

bool FtNodes::report_done(bool completed) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The thread has ended: the connection is this thread's now.
  if (keys_ == nullptr || !store_error_.empty()) return false;
  try {
    keys_->set(str_cat("node_done/", node_rank_), std::string(completed ? "completed" : "failed"));
    return true;
  } catch (const Error&) {
    return false;
  }
}

bool FtNodes::store_answers(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!store_error_.empty()) return false;
  if (store_ == nullptr) return true;  // not reached yet: nothing is known against it
  const int64_t answered = looks_answered_;
  look_requested_ = true;
  wake_.notify_all();
  looked_.wait_for(lock, limit, [&] { return looks_answered_ > answered || !store_error_.empty(); });
  return store_error_.empty();
}

void FtNodes::worker_failed(long pid) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    failed_pids_.push_back(pid);
  }
  wake_.notify_all();
}

void FtNodes::follow() {
  std::unique_lock<std::mutex> lock(mutex_);
  // Connect, for as long as it takes: node 0 may start after this one.
  while (store_ == nullptr && !stopping_) {
    lock.unlock();
    std::shared_ptr<Store> store;
    std::string refused;
    try {
      TcpStoreOptions attempt = options_;
      attempt.timeout = kConnectAttempt;
      store = std::make_shared<TcpStore>(attempt);
    } catch (const InvalidArgumentError& e) {
      refused = e.what();  // the wrong token or run id: retrying cannot help
    } catch (const Error&) {
      // Not up yet.
    }
    lock.lock();
    if (!refused.empty()) {
      store_error_ = refused;
      looked_.notify_all();
      return;
    }
    store_ = std::move(store);
    // The decider's keys are under the same prefix (datapar/ft/membership/decider.h).
    if (store_) keys_ = std::make_shared<PrefixStore>(prefix_, store_);
  }
  while (!stopping_) {
    const bool requested = look_requested_;
    look_requested_ = false;
    lock.unlock();
    std::string failed;
    try {
      look();
    } catch (const std::exception& e) {  // a malformed record too: what it says cannot be known
      failed = e.what();
    }
    lock.lock();
    if (requested) ++looks_answered_;
    if (!failed.empty()) store_error_ = failed;
    looked_.notify_all();
    if (!failed.empty()) return;
    wake_.wait_for(lock, interval_, [&] { return stopping_ || look_requested_ || !failed_pids_.empty(); });
  }
}

void FtNodes::look() {
  Store& store = *keys_;
  std::vector<long> failed;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    failed.swap(failed_pids_);
  }
  for (const long pid : failed) {  // a worker that never named its member is judged by its heartbeat
    const std::string key = ft::launched_worker_key(run_, node_rank_, pid);
    if (store_->check({key})) ft::report_dead(store_, run_, as_text(store_->get(key)));
  }
  if (node_rank_ != 0) {
    store.add(str_cat("node_beat/", node_rank_), 1);
    if (!store.check({"epoch"})) return;
    const int64_t number = std::stoll(as_text(store.get("epoch")));
    const ft::Membership newest = ft::Membership::decode(number, as_text(store.get(str_cat("epoch/", number))));
    if (!newest.stop_reason.empty()) {
      const std::lock_guard<std::mutex> lock(mutex_);
      stop_reason_ = newest.stop_reason;
      complete_ = newest.complete;
    }
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  int ended = 0;
  bool completed = false;
  for (int k = 1; k < nnodes_; ++k) {
    Node& node = others_[static_cast<size_t>(k)];
    if (!node.ended) {
      const std::string done = str_cat("node_done/", k);
      if (store.check({done})) {
        node.ended = true;
        completed |= as_text(store.get(done)) == "completed";
      } else {
        const int64_t beats = store.add(str_cat("node_beat/", k), 0);
        if (beats != node.beats) node.beats = beats, node.changed = now;
        node.ended = now - node.changed > (node.beats <= 0 ? absent_limit_ : silent_limit_);
      }
    }
    ended += node.ended ? 1 : 0;
  }
  const std::lock_guard<std::mutex> lock(mutex_);
  others_ended_ = ended;
  other_completed_ = other_completed_ || completed;
}

}  // namespace datapar::tools
