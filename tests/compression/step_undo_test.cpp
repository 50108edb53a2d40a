// Undoing a codec's step (GradCodec::keep_step_undo / undo_steps_from, used by step-level fault
// tolerance), on hand-made buckets with 2 ranks as threads: keeping the undo does not change a
// bit, an undone step leaves the state of before it (also when only some of its buckets were
// reduced), a redone step gives the bits of the first time, and an undo that was not kept is an
// error.
#include "tests/compression/codec_test_util.h"

#include <tandem/base/errors.h>
#include <tandem/collectives/compression.h>

namespace tandem {
namespace {

// Two buckets per step: the first three parameters of kShapes, then the last.
std::vector<GradBucket> buckets_of(int rank, int64_t step) {
  const at::Tensor g = grad_of(rank, step, numel_of(kShapes));
  const int64_t first = numel_of({kShapes[0], kShapes[1], kShapes[2]});
  GradBucket a = make_bucket({kShapes[0], kShapes[1], kShapes[2]}, g.narrow(0, 0, first), step);
  GradBucket b = make_bucket({kShapes[3]}, g.narrow(0, first, g.numel() - first), step);
  b.index = 1;
  b.param_indices = {3};
  return {a, b};
}

std::map<std::string, at::Tensor> copy_of(const std::map<std::string, at::Tensor>& state) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : state) out[name] = t.clone();
  return out;
}

void expect_same(const std::map<std::string, at::Tensor>& a,
                 const std::map<std::string, at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << what << ": " << name;
    EXPECT_TRUE(at::equal(t, b.at(name))) << what << ": " << name;
  }
}

using Make = std::function<std::shared_ptr<GradCodec>()>;

std::vector<std::pair<std::string, Make>> stateful_codecs() {
  PowerSgdOptions p;
  p.start_iter = 1;
  p.rank = 2;
  PowerSgdOptions cold = p;
  cold.warm_start = false;
  return {{"powersgd", [p] { return make_powersgd_codec(p); }},
          {"powersgd cold start", [cold] { return make_powersgd_codec(cold); }},
          {"topk", [] { return make_topk_codec({.ratio = 0.1, .warmup_steps = 3}); }},
          {"sign", [] { return make_sign_codec(); }},
          {"powersgd+bf16", [p] { return make_cast_codec(at::kBFloat16, make_powersgd_codec(p)); }}};
}

// Steps 0-4; step 3 is first aborted after `reduced_before_abort` of its two buckets, undone, and
// redone. Every decoded bucket and the final state match a run that kept no undo.
void expect_undo(const std::string& name, const Make& make, int reduced_before_abort) {
  SCOPED_TRACE(name + ", " + std::to_string(reduced_before_abort) + " bucket(s) reduced");
  constexpr int kSteps = 5, kAborted = 3;
  std::vector<std::vector<at::Tensor>> straight(2), undone(2);
  std::vector<std::map<std::string, at::Tensor>> straight_state(2), undone_state(2);
  testing::run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    auto plain = make();
    for (int step = 0; step < kSteps; ++step) {
      for (GradBucket& b : buckets_of(r, step)) {
        plain->reduce(comm, b)->wait();
        straight[r].push_back(b.buffer.clone());
      }
    }
    straight_state[r] = copy_of(plain->state());

    auto codec = make();
    codec->keep_step_undo(true);
    std::map<std::string, at::Tensor> before;
    for (int step = 0; step < kSteps; ++step) {
      if (step == kAborted) {
        before = copy_of(codec->state());
        auto buckets = buckets_of(r, step);
        for (int i = 0; i < reduced_before_abort; ++i) codec->reduce(comm, buckets[i])->wait();
        codec->undo_steps_from(step);
        expect_same(codec->state(), before, "after the undo");
      }
      for (GradBucket& b : buckets_of(r, step)) {
        codec->reduce(comm, b)->wait();
        undone[r].push_back(b.buffer.clone());
      }
    }
    undone_state[r] = copy_of(codec->state());
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(straight[r].size(), undone[r].size());
    for (size_t i = 0; i < straight[r].size(); ++i)
      EXPECT_TRUE(at::equal(straight[r][i], undone[r][i])) << "rank " << r << " bucket " << i;
    expect_same(straight_state[r], undone_state[r], "rank " + std::to_string(r) + " at the end");
  }
}

TEST(StepUndo, AnUndoneStepLeavesTheStateOfBeforeItAndARedoTheSameBits) {
  for (const auto& [name, make] : stateful_codecs()) {
    for (int reduced : {0, 1, 2}) expect_undo(name, make, reduced);
  }
}

TEST(StepUndo, UndoingWhatWasNotKeptIsAnError) {
  testing::run_ranks(2, [](Communicator& comm) {
    auto codec = make_topk_codec({.ratio = 0.1});
    for (GradBucket& b : buckets_of(comm.rank(), 0)) codec->reduce(comm, b)->wait();
    EXPECT_THROW(codec->undo_steps_from(0), Error);
    codec->undo_steps_from(1);  // nothing of step 1 or later to undo
  });
}

TEST(StepUndo, StatelessCodecsHaveNothingToUndo) {
  testing::run_ranks(2, [](Communicator& comm) {
    for (auto codec : {make_average_codec(), make_cast_codec(at::kHalf, make_average_codec())}) {
      codec->keep_step_undo(true);
      GradBucket b = buckets_of(comm.rank(), 0)[0];
      codec->reduce(comm, b)->wait();
      codec->undo_steps_from(0);
      EXPECT_TRUE(codec->state().empty());
    }
  });
}

}  // namespace
}  // namespace tandem
