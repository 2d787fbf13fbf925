// The launchers of a fault-tolerant job and the store (Note [A fault-tolerant job's
// launcher] in launch.cc). Every launcher reports its workers that die to the decider
// (ft::launched_worker_key, ft::report_dead). Node 0's launcher serves the store and runs the
// decider; the others have neither, and learn the decider's verdict from the store. Each beats there
// while it runs and reports when it is done, and node 0 serves the store until every other
// node is done or gone (silent), so that no node's last worker, still evaluating or
// writing the final checkpoint, loses the store.
//
// Store keys, under "ft/<run>/" (beside the decider's, datapar/ft/membership/decider.h):
//   node_beat/<k>   node k's launcher adds 1 every interval while it runs
//   node_done/<k>   node k's launcher is done: "completed" (one of its workers finished the
//                   training) or "failed"
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "datapar/rendezvous/tcp_store.h"

namespace datapar::tools {

class FtNodes {
 public:
  // Follows job `run` on the store `store` names (a client's options) from node
  // `node_rank` of `nnodes`, looking every `interval` on a thread and a connection of its own.
  // Node 0 counts another node gone once its beat stopped for `silent_limit`, or, never
  // seen, `absent_limit` after the start.
  FtNodes(TcpStoreOptions store, const std::string& run, int node_rank, int nnodes, std::chrono::milliseconds interval,
          std::chrono::milliseconds silent_limit, std::chrono::milliseconds absent_limit);
  ~FtNodes();
  FtNodes(const FtNodes&) = delete;
  FtNodes& operator=(const FtNodes&) = delete;

  // Nodes other than 0: the decider's reason for stopping the job; "" while it goes on.
  std::string stop_reason() const;
  // Whether that verdict is that the training is complete (ft::Decider::training_complete).
  bool training_complete() const;
  // Why the store, once reached, cannot be any more (node 0's launcher gone, the network
  // down); "" while it can. The job cannot go on without it: nothing is restarted then.
  std::string store_error() const;
  // Node 0: how many other nodes are done or gone, and whether one of them completed.
  int others_ended() const;
  bool other_completed() const;
  // Looks at the store now, waiting at most `limit`, and says whether it still answers
  // (false: store_error() says why). Before restarting a worker, which could not join without it.
  bool store_answers(std::chrono::milliseconds limit);
  // The worker with process id `pid` exited with a failure: its member is reported dead, so
  // that the others go on at once (soon, from the following thread).
  void worker_failed(long pid);
  // Nodes other than 0: reports this node done (stops following first). Returns false when
  // the store cannot be reached.
  bool report_done(bool completed);

 private:
  void follow();
  // One look at the store; throws what the store throws.
  void look();

  const TcpStoreOptions options_;
  const std::string run_, prefix_;
  const int node_rank_, nnodes_;
  const std::chrono::milliseconds interval_, silent_limit_, absent_limit_;

  // Node 0's view of each other node (the following thread's).
  struct Node {
    int64_t beats = -1;  // -1: never seen
    std::chrono::steady_clock::time_point changed;
    bool ended = false;
  };
  std::vector<Node> others_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;           // the following thread: something to do
  std::condition_variable looked_;         // store_answers(): a look ended
  bool look_requested_ = false;            // guarded by mutex_
  int64_t looks_answered_ = 0;             // guarded by mutex_
  bool stopping_ = false;                  // guarded by mutex_
  std::shared_ptr<Store> store_;           // the following thread's; set once connected
  std::shared_ptr<Store> keys_;            // store_ under prefix_
  std::vector<long> failed_pids_;          // guarded by mutex_: to report
  std::string stop_reason_, store_error_;  // guarded by mutex_
  bool complete_ = false;                  // guarded by mutex_
  int others_ended_ = 0;                   // guarded by mutex_
  bool other_completed_ = false;           // guarded by mutex_
  std::thread thread_;
};

}  // namespace datapar::tools
