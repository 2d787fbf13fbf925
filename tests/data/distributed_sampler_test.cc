#include "datapar/data/distributed_sampler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "datapar/error.h"
#include "testing/expect_throw.h"
#include "testing/python.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

DistributedSampler make(int64_t n, int64_t world_size, int64_t rank, bool shuffle, bool drop_last = false,
                        uint64_t seed = 0) {
  DistributedSamplerOptions o;
  o.dataset_size = n;
  o.world_size = world_size;
  o.rank = rank;
  o.shuffle = shuffle;
  o.drop_last = drop_last;
  o.seed = seed;
  return DistributedSampler(o);
}

using V = std::vector<int64_t>;

TEST(DistributedSampler, UnshuffledListsPadByWrappingOrDropTheTail) {
  // 10 samples over 3 ranks: padded to 12 with 0, 1; or cut to 9.
  EXPECT_EQ(to_vector(make(10, 3, 0, false).indices()), (V{0, 3, 6, 9}));
  EXPECT_EQ(to_vector(make(10, 3, 1, false).indices()), (V{1, 4, 7, 0}));
  EXPECT_EQ(to_vector(make(10, 3, 2, false).indices()), (V{2, 5, 8, 1}));
  EXPECT_EQ(to_vector(make(10, 3, 1, false, true).indices()), (V{1, 4, 7}));
  EXPECT_EQ(make(10, 3, 0, false).num_samples(), 4);
  EXPECT_EQ(make(10, 3, 0, false).total_size(), 12);
  EXPECT_EQ(make(10, 3, 0, false, true).num_samples(), 3);
  // Fewer samples than ranks: the list repeats itself.
  EXPECT_EQ(to_vector(make(2, 4, 2, false).indices()), (V{0}));
  EXPECT_EQ(to_vector(make(2, 4, 3, false).indices()), (V{1}));
  EXPECT_EQ(to_vector(make(1, 3, 2, false).indices()), (V{0}));
  EXPECT_EQ(make(2, 4, 3, false, true).num_samples(), 0);
  EXPECT_EQ(make(0, 2, 1, true).num_samples(), 0);
  EXPECT_EQ(make(0, 2, 1, true).indices().numel(), 0);
}

TEST(DistributedSampler, RanksCoverEverySampleOnceApartFromMarkedPadding) {
  for (int64_t world_size = 1; world_size <= 8; ++world_size) {
    for (int64_t n : {0, 1, 5, 16, 17, 31}) {
      for (bool drop_last : {false, true}) {
        std::multiset<int64_t> seen;
        int64_t real = 0;
        for (int64_t rank = 0; rank < world_size; ++rank) {
          DistributedSampler s = make(n, world_size, rank, true, drop_last, 7);
          s.set_epoch(3);
          const V idx = to_vector(s.indices());
          ASSERT_EQ(static_cast<int64_t>(idx.size()), s.num_samples());
          const at::Tensor mask = s.padding_mask();
          for (int64_t i = 0; i < s.num_samples(); ++i) {
            ASSERT_EQ(mask[i].item<bool>(), s.is_padding(i));
            if (!s.is_padding(i)) seen.insert(idx[i]);
          }
          EXPECT_EQ(s.num_real_samples(), s.num_samples() - mask.sum().item<int64_t>());
          real += s.num_real_samples();
        }
        const int64_t want = drop_last ? (n / world_size) * world_size : n;
        EXPECT_EQ(real, want) << "n=" << n << " world_size=" << world_size;
        EXPECT_EQ(static_cast<int64_t>(seen.size()), want);
        EXPECT_EQ(static_cast<int64_t>(std::set<int64_t>(seen.begin(), seen.end()).size()), want)
            << "a sample was counted twice: n=" << n << " world_size=" << world_size;
      }
    }
  }
}

TEST(DistributedSampler, ExactEvaluationMarksTheWrappedPositions) {
  // 10 samples over 4 ranks: 12 positions, the last two (rank 2 and 3, position 2) repeat 0 and 1.
  for (int64_t rank = 0; rank < 4; ++rank) {
    DistributedSampler s(DistributedSamplerOptions::evaluation(10, 4, rank));
    EXPECT_EQ(s.num_samples(), 3);
    EXPECT_EQ(s.is_padding(2), rank >= 2) << rank;
    EXPECT_FALSE(s.is_padding(1));
    EXPECT_EQ(s.num_real_samples(), rank >= 2 ? 2 : 3);
  }
  DistributedSampler s(DistributedSamplerOptions::evaluation(10, 4, 3));
  EXPECT_EQ(to_vector(s.indices()), (V{3, 7, 1}));
  EXPECT_TRUE(at::equal(s.padding_mask(1, 3), at::tensor({0, 1}).to(at::kBool)));
  EXPECT_THROW_MSG(s.is_padding(3), InvalidArgumentError, "outside this rank's list [0, 3)");
}

TEST(DistributedSampler, PermutationDependsOnSeedAndEpochOnly) {
  DistributedSampler a = make(50, 2, 0, true, false, 11);
  DistributedSampler b = make(50, 2, 1, true, false, 11);
  a.set_epoch(4);
  b.set_epoch(4);
  // Interleaving the two ranks' lists gives back one permutation of 0..49.
  const at::Tensor both = at::stack({a.indices(), b.indices()}, 1).flatten();
  EXPECT_TRUE(at::equal(std::get<0>(both.sort()), at::arange(50, at::kLong)));
  EXPECT_FALSE(at::equal(both, at::arange(50, at::kLong)));
  EXPECT_FALSE(at::equal(a.indices(), make(50, 2, 0, true, false, 11).indices()));  // epoch 0 differs
  DistributedSampler c = make(50, 2, 0, true, false, 11);
  c.set_epoch(4);
  EXPECT_TRUE(at::equal(a.indices(), c.indices()));
  DistributedSampler d = make(50, 2, 0, true, false, 12);
  d.set_epoch(3);  // seed 12 + epoch 3 == seed 11 + epoch 4, as in PyTorch
  EXPECT_TRUE(at::equal(a.indices(), d.indices()));
}

// The lists equal torch.utils.data.DistributedSampler's, case by case.
TEST(DistributedSampler, MatchesPyTorch) {
  DATAPAR_REQUIRE_PYTHON_TORCH();
  struct Case {
    int64_t n, world_size, rank, epoch;
    bool drop_last, shuffle;
    uint64_t seed;
  };
  const std::vector<Case> cases{{10, 3, 0, 0, false, true, 0},    {10, 3, 2, 5, false, true, 0},
                                {10, 3, 1, 1, true, true, 0},     {100, 4, 3, 7, false, true, 0},
                                {101, 4, 3, 7, true, true, 0},    {7, 8, 6, 2, false, true, 0},
                                {3, 8, 7, 1, false, true, 5},     {1000, 5, 4, 3, false, true, 42},
                                {60000, 3, 1, 9, false, true, 1}, {5, 2, 1, 0, false, false, 0}};
  std::ostringstream script;
  script << "import sys, torch\nfrom torch.utils.data import DistributedSampler\n"
            "out = open(sys.argv[1], 'w')\nfor n, w, r, e, d, sh, seed in [";
  for (const Case& c : cases) {
    script << "(" << c.n << "," << c.world_size << "," << c.rank << "," << c.epoch << ","
           << (c.drop_last ? "True" : "False") << "," << (c.shuffle ? "True" : "False") << "," << c.seed << "),";
  }
  script << "]:\n"
            "    s = DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=sh, seed=seed, drop_last=d)\n"
            "    s.set_epoch(e)\n"
            "    out.write(' '.join(str(i) for i in s) + '\\n')\n";
  const testing::TempDir temp("sampler");
  const std::string& dir = temp.path();
  ASSERT_EQ(testing::run_python(dir, "sampler.py", script.str(), dir + "/lists.txt"), 0);
  std::ifstream lists(dir + "/lists.txt");
  for (const Case& c : cases) {
    std::string line;
    ASSERT_TRUE(std::getline(lists, line));
    std::istringstream in(line);
    V want;
    for (int64_t i; in >> i;) want.push_back(i);
    DistributedSampler s = make(c.n, c.world_size, c.rank, c.shuffle, c.drop_last, c.seed);
    s.set_epoch(c.epoch);
    EXPECT_EQ(to_vector(s.indices()), want) << "n=" << c.n << " world_size=" << c.world_size << " rank=" << c.rank
                                            << " epoch=" << c.epoch << " drop_last=" << c.drop_last;
  }
}

TEST(DistributedSampler, StateRestoresTheRestOfTheEpoch) {
  DistributedSampler s = make(37, 3, 1, true, false, 9);
  s.set_epoch(2);
  const V full = to_vector(s.indices());
  s.advance(5);
  s.advance(3);
  const SamplerState saved = s.state();
  EXPECT_EQ(saved.epoch, 2);
  EXPECT_EQ(saved.seed, 9u);
  EXPECT_EQ(saved.consumed, 8);

  // A fresh process: other seed and epoch in its options, until the state arrives.
  DistributedSampler resumed = make(37, 3, 1, true, false, 0);
  resumed.load_state(saved);
  EXPECT_EQ(resumed.epoch(), 2);
  EXPECT_EQ(resumed.position(), 8);
  EXPECT_EQ(to_vector(resumed.remaining()), V(full.begin() + 8, full.end()));
  EXPECT_EQ(to_vector(resumed.indices()), full);

  resumed.set_epoch(3);  // a new epoch starts from its beginning
  EXPECT_EQ(resumed.position(), 0);
  EXPECT_EQ(resumed.remaining().numel(), resumed.num_samples());
}

TEST(DistributedSampler, RejectsBadOptionsAndForeignStates) {
  EXPECT_THROW_MSG(make(10, 3, 3, true), InvalidArgumentError, "rank 3 is outside [0, 3)");
  EXPECT_THROW_MSG(make(10, 3, -1, true), InvalidArgumentError, "rank -1 is outside [0, 3)");
  EXPECT_THROW_MSG(make(10, 0, 0, true), InvalidArgumentError, "world_size is 0; it must be at least 1");
  EXPECT_THROW_MSG(make(-1, 1, 0, true), InvalidArgumentError, "dataset_size is -1");
  DistributedSampler s = make(10, 3, 0, true);
  EXPECT_THROW_MSG(s.set_epoch(-1), InvalidArgumentError, "epoch is -1");
  s.advance(4);
  EXPECT_THROW_MSG(s.advance(1), InvalidArgumentError, "passes the end of this rank's list (4 samples)");
  SamplerState other = make(12, 3, 0, true).state();
  EXPECT_THROW_MSG(s.load_state(other), InvalidArgumentError, "saved for 12 samples over 3 ranks");
  other = s.state();
  other.world_size = 2;
  EXPECT_THROW_MSG(s.load_state(other), InvalidArgumentError, "this sampler has 10 samples over 3 ranks");
  other = s.state();
  other.consumed = 5;
  EXPECT_THROW_MSG(s.load_state(other), InvalidArgumentError, "5 samples consumed is outside [0, 4]");
}

}  // namespace
}  // namespace datapar
