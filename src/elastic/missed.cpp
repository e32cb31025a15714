// A step's update as the ranks applied it (include/dra/torch/elastic/controller.hpp): a rank that
// did not call step() after a reduction, or whose optimizer did not step, rides the "missed" flag
// with the next reduction, where the world compares its states; and a decision held while an
// accumulation window without no_sync() is open.
#include <ATen/Functions.h>

#include <cstdio>
#include <string>

#include "dra/error.hpp"
#include "dra/torch/elastic/controller.hpp"
#include "gradient_reducer.hpp"

namespace dra::elastic {

// The previous reduction was never followed by step(): the trainer skipped the update after
// backward (a `continue` on a non-finite gradient norm: every rank alike, since they share the
// reduced gradient) or caught an exception there. The world committed that step, this process did
// not, and whether its optimizer applied the update is unknown. It commits the step as the world
// did. On a synchronous backend the miss rides with the next reduction, and the world settles it
// there (settle_missed_step): identical states go on, a differing one is taken again. On an
// asynchronous one (NCCL: the tail is read steps later) the process takes the world's state again
// at once through a recovery (holding none, so another member's state wins).
bool controller::catch_up_missed_step() noexcept {
  if (!reduced_ || !failure_.empty() || role_ != role::member || !comm_) return false;
  reduced_ = false;
  if (refused_) {
    // The world refused that step: nothing was committed anywhere, and it is redone.
    refusal_ = std::move(refused_);
    refused_.reset();
    pending_loss_->count = 0.0;
    pending_loss_->energy_j = 0.0;
    return false;
  }
  const std::int64_t missed = step_index_;
  sampler_->commit(batch_.micro);
  batch_ = {};
  ++step_index_;
  if (comm_->size() == 1) {
    std::fprintf(stderr,
                 "[dra] process %d reduced step %lld but did not call step(): counted as committed; its optimizer "
                 "update is this process's own (call dra.step after every backward)\n",
                 uid_, static_cast<long long>(missed));
    return true;
  }
  // The missed step has no loss or energy figure of this rank's to report.
  pending_loss_->count = 0.0;
  pending_loss_->energy_j = 0.0;
  if (!comm_->asynchronous()) {
    missed_ = missed;
    return true;
  }
  std::fprintf(stderr,
               "[dra] rank %d (process %d) reduced step %lld but did not call step() (an exception caught after "
               "backward?): it takes the world's state again (call dra.step after every backward)\n",
               comm_->rank(), uid_, static_cast<long long>(missed));
  holds_state_ = false;
  failure_ = "rank " + std::to_string(comm_->rank()) + " (process " + std::to_string(uid_) +
             ") skipped step() after step " + std::to_string(missed) + "'s reduction";
  return true;
}

// Ranks did not call step() after the previous reduction (the tail counts them; every rank reads
// the same count, so all take this path together). Their optimizers may or may not have applied
// that update: the world compares its state digests against the reference, the first rank that
// did call step() (rank 0 when none did). Identical everywhere (every rank skipped the update, or
// every rank applied it): the world goes on, and this step's gradient, computed on those states,
// stands. Otherwise the ranks that differ take the reference's state again through a recovery that
// every rank enters, and this step is redone.
bool controller::settle_missed_step(double missed) {
  const std::optional<std::int64_t> mine = missed_;
  missed_.reset();
  const auto ranks = static_cast<long long>(std::llround(missed));
  const long long step = step_index_ - 1;  // the missed step (a rank that missed it committed it since)
  double differ = 0.0;
  int reference = 0;
  try {
    at::Tensor who = at::zeros({comm_->size()});
    who[comm_->rank()] = mine ? 1.0 : 0.0;
    comm_->all_reduce_sum(who);
    const auto flags = who.contiguous();
    for (int r = comm_->size() - 1; r >= 0; --r)
      if (flags[r].item<double>() < 0.5) reference = r;
    const std::uint64_t digest = state_digest();
    at::Tensor theirs = at::full({1}, static_cast<std::int64_t>(digest), at::kLong);
    comm_->broadcast(theirs, reference);
    const bool same = theirs.item<std::int64_t>() == static_cast<std::int64_t>(digest);
    if (!same) holds_state_ = false;
    at::Tensor count = at::full({1}, same ? 0.0 : 1.0);
    comm_->all_reduce_sum(count);
    differ = count.item<double>();
  } catch (const dra::error& e) {
    failure_ = std::string("comparing states after a missed step() failed: ") + e.what();
    comm_->revoke();
    return false;
  }
  if (differ < 0.5) {
    if (comm_->rank() == 0 && !missed_said_)
      std::fprintf(stderr,
                   "[dra] %lld of %d rank(s) did not apply step %lld's update (their optimizer did not step, or "
                   "step() was not called: an update skipped on purpose, as for a non-finite gradient norm, or an "
                   "exception caught after backward); every rank's state is still identical, so the world goes on "
                   "(a step without step() counts its batches as consumed and reports no loss) (said once)\n",
                   ranks, comm_->size(), step);
    missed_said_ = true;
    return true;
  }
  if (!holds_state_)
    std::fprintf(
        stderr,
        "[dra] rank %d (process %d)%s: its state differs from rank %d's, and it takes that state again "
        "(call dra.step after every backward; skip an update on every rank alike, deciding on what every "
        "rank holds, as the clipped gradient norm or status.loss, never on this rank's own loss)\n",
        comm_->rank(), uid_,
        mine ? (" did not apply step " + std::to_string(*mine) + "'s update (no optimizer step, or no step())").c_str()
             : " applied the previous step's update while other ranks did not",
        reference);
  failure_ = std::to_string(ranks) + " rank(s) did not apply step " + std::to_string(step) + "'s update and " +
             std::to_string(std::llround(differ)) + " rank(s) hold a state that differs from rank " +
             std::to_string(reference) + "'s";
  return false;
}

bool controller::hold_for_window() {
  const bool applies = decision_flag_ || (options_.capacity_poll_s == 0.0 && comm_ && comm_->size() > 1);
  if (!window_open_ || !applies || window_held_ >= kWindowHoldSteps) {
    if (applies) window_held_ = 0;
    return false;
  }
  ++window_held_;
  return true;
}

void controller::note_update_skipped() noexcept {
  if (role_ != role::member || !comm_ || comm_->size() < 2 || comm_->asynchronous() || missed_ || step_index_ < 1)
    return;
  missed_ = step_index_ - 1;
}

}  // namespace dra::elastic
