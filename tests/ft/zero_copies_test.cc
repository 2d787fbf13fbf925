// ZeroRedundancyOptimizer with 2 copies of each shard, re-sharded by ft::detail::reshard_zero
// (issues 31, 45), with the members as threads. The same training as one SGD; after a
// membership change the shards move to their new keepers; a member that missed the outcome
// of a vote another member committed applies the update (Note [A voted step whose outcome a
// member missed]); two neighbours lost at once stop the job with the reason.
#include "datapar/ddp/zero_redundancy_optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "datapar/dcp/zero_state.h"
#include "datapar/ft/fault_tolerant_ddp.h"
#include "datapar/ft/membership/membership.h"
#include "optim/state_key.h"
#include "testing/expect_throw.h"
#include "testing/gloo_ranks.h"

namespace datapar::ft {
namespace {

namespace optim = torch::optim;

// The same initial values on every member (threads share the default generator: one lock).
torch::nn::Sequential make_model() {
  static std::mutex generator;
  const std::lock_guard<std::mutex> lock(generator);
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Linear(8, 2));
}

std::unique_ptr<optim::Optimizer> make_sgd(std::vector<at::Tensor> params) {
  return std::make_unique<optim::SGD>(params, optim::SGDOptions(0.1).momentum(0.9));
}

// Step `step`'s gradient of parameter `index`: the same on every member, as after DDP.
at::Tensor gradient(const at::Tensor& param, size_t index, int64_t step) {
  return at::full_like(param, 0.01 * static_cast<double>(index + 1)) + 0.001 * static_cast<double>(step);
}

void set_gradients(std::vector<at::Tensor>& params, int64_t step) {
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = gradient(params[i], i, step);
}

at::Tensor momentum_of(const optim::Optimizer& optimizer, const at::Tensor& param) {
  using StateMap = std::decay_t<decltype(optimizer.state())>;
  const auto it = optimizer.state().find(datapar::detail::optimizer_state_key<StateMap>(param));
  if (it == optimizer.state().end()) return {};
  return static_cast<const optim::SGDParamState&>(*it->second).momentum_buffer();
}

// One SGD over the whole model, `steps` steps: the parameters and momentum buffers every
// sharded run must end with.
struct Reference {
  std::vector<at::Tensor> params, momentum;
  explicit Reference(int64_t steps) {
    torch::nn::Sequential model = make_model();
    std::vector<at::Tensor> p = model->parameters();
    optim::SGD sgd(p, optim::SGDOptions(0.1).momentum(0.9));
    for (int64_t step = 0; step < steps; ++step) {
      set_gradients(p, step);
      sgd.step();
    }
    for (const at::Tensor& t : p) {
      params.push_back(t.detach().clone());
      momentum.push_back(momentum_of(sgd, t).clone());
    }
  }
};

ZeroOptions two_copies() {
  ZeroOptions o;
  o.copies = 2;
  return o;
}

// A member: its model and its sharded optimizer, kept across groups.
struct Member {
  torch::nn::Sequential model = make_model();
  std::vector<at::Tensor> params = model->parameters();
  ZeroRedundancyOptimizer sharded{params, make_sgd, two_copies()};
};

void expect_equal(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::allclose(got[i], want[i], 1e-6, 1e-7)) << what << " " << i;
}

// Three members over one group train steps 0 and 1 together, all committed in epoch 1;
// step 2's vote is committed by members 0 and 2, while member 1 missed its outcome.
std::vector<std::unique_ptr<Member>> three_after_a_missed_vote() {
  std::vector<std::unique_ptr<Member>> members;
  for (int i = 0; i < 3; ++i) members.push_back(std::make_unique<Member>());
  testing::run_gloo_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Member& m = *members[static_cast<size_t>(rank)];
    Standing start;
    EXPECT_EQ(detail::reshard_zero(m.sharded, *group, start).step, 0);
    for (int64_t step = 0; step < 2; ++step) {
      set_gradients(m.params, step);
      m.sharded.step();
    }
    // Each member keeps its own shard and the one before it: 2/3 of the parameters here.
    const int64_t all = [&] {
      int64_t n = 0;
      for (const at::Tensor& p : m.params) n += p.numel();
      return n;
    }();
    int64_t kept = 0;
    for (size_t i = 0; i < m.params.size(); ++i) {
      const int owner = m.sharded.owner(i);
      EXPECT_EQ(m.sharded.keeps(i), owner == rank || (owner + 1) % 3 == rank) << "parameter " << i;
      if (m.sharded.keeps(i)) kept += m.params[i].numel();
    }
    EXPECT_EQ(m.sharded.state_bytes(), kept * 4);
    EXPECT_LT(kept, all);
    set_gradients(m.params, 2);
    if (rank != 1) m.sharded.update();  // committed step 2 (its outcome reached 0 and 2)
  });
  return members;
}

// Where the members stand after three_after_a_missed_vote(): 0 and 2 at step 3, committed in
// epoch 1; 1 at step 2, having voted for step 2 in epoch 1 without learning the outcome.
Standing standing_of(int member) { return member == 1 ? Standing{2, 1, 2, 1} : Standing{3, 1, -1, 0}; }

// Member `m`, rank `rank` of the group it was re-sharded over, trains step 3 with the others
// and they consolidate on rank 0: the result must be one SGD's after four steps.
void train_step_three_and_compare(Member& m, int rank, const Reference& reference) {
  set_gradients(m.params, 3);
  m.sharded.step();
  expect_equal(m.params, reference.params, "rank " + std::to_string(rank) + "'s parameter");
  const std::unique_ptr<optim::Optimizer> whole = m.sharded.consolidate(0);
  ASSERT_EQ(whole != nullptr, rank == 0);
  if (!whole) return;
  std::vector<at::Tensor> momentum;
  for (const at::Tensor& p : m.params) momentum.push_back(momentum_of(*whole, p));
  expect_equal(momentum, reference.momentum, "momentum of parameter");
}

// Member 0 died. Shard 0 was kept by it and by member 1, which missed step 2's outcome:
// member 1 applies that update (member 2 committed it in the same epoch), so the shard is
// still there at the newest step, and the two go on as one SGD would.
TEST(ZeroTwoCopies, AMemberThatMissedACommittedVoteAppliesItAndKeepsItsShard) {
  const Reference reference(4);
  auto members = three_after_a_missed_vote();
  ASSERT_TRUE(members[0]->sharded.keeps(0) && members[1]->sharded.keeps(0) && !members[2]->sharded.keeps(0))
      << "the test expects shard 0 on members 0 and 1 only";
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    const int member = rank + 1;
    Standing standing = standing_of(member);
    Member& m = *members[static_cast<size_t>(member)];
    const detail::Resharded r = detail::reshard_zero(m.sharded, *group, standing);
    EXPECT_EQ(r.step, 3);
    EXPECT_EQ(r.source, 0);  // member 1, at step 3 now
    // Its standing says so: the vote applied, the step the one it keeps now.
    EXPECT_EQ(standing.step, 3);
    EXPECT_EQ(standing.commit_epoch, 1);
    EXPECT_EQ(standing.voted_step, -1);
    train_step_three_and_compare(m, rank, reference);
  });
}

// The same, but member 2 committed step 3 in a later epoch, without member 1 (member 1 was
// stopped meanwhile): member 1's vote is stale and applies nothing, and nobody has shard 0
// at step 3 any more: both stop with the reason instead of training on a wrong state.
TEST(ZeroTwoCopies, AShardLostWithBothItsKeepersStopsTheJobWithTheReason) {
  auto members = three_after_a_missed_vote();
  testing::run_gloo_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    const int member = rank + 1;
    Standing standing = member == 1 ? standing_of(1) : Standing{3, 2, -1, 0};
    try {
      detail::reshard_zero(members[static_cast<size_t>(member)]->sharded, *group, standing);
      ADD_FAILURE() << "member " << member << " went on without shard 0's state";
    } catch (const MembershipError& e) {
      EXPECT_NE(std::string(e.what()).find("no member has the optimizer state of parameter 0 (["), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
    }
  });
}

// Member 1 left; a new member joins members 0 and 2. It takes two shards' state (and every
// parameter) from them, member 2 takes shard 0 from member 0, and the three go on as one
// SGD would.
TEST(ZeroTwoCopies, ANewMemberTakesItsShardsFromTheMembersThatKeptThem) {
  const Reference reference(4);
  auto members = three_after_a_missed_vote();
  auto newcomer = std::make_unique<Member>();
  const std::vector<Member*> by_rank = {members[0].get(), members[2].get(), newcomer.get()};
  testing::run_gloo_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Standing standing = rank == 2 ? Standing{} : standing_of(rank == 0 ? 0 : 2);
    Member& m = *by_rank[static_cast<size_t>(rank)];
    EXPECT_EQ(detail::reshard_zero(m.sharded, *group, standing).step, 3);
    train_step_three_and_compare(m, rank, reference);
  });
}


// A shard kept twice is not the layout DCP's ZeRO entries have (each owner's state once):
// refused, naming the way that works, rather than saved or loaded wrong.
TEST(ZeroTwoCopies, DcpRefusesItAndNamesTheWholeStateWay) {
  Member m;
  dcp::State state;
  EXPECT_THROW_MSG(dcp::add_zero_optimizer(state, "optim", m.sharded, *m.model), InvalidArgumentError,
                   "keeps each shard twice (ZeroOptions::copies 2, fault tolerance); save and load its state whole");
  EXPECT_THROW_MSG(dcp::apply_zero_optimizer(state, "optim", m.sharded, *m.model), InvalidArgumentError,
                   "dcp::apply_zero_optimizer: the ZeroRedundancyOptimizer keeps each shard twice");
}

}  // namespace
}  // namespace datapar::ft
