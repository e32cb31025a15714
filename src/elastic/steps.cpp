// The controller's steps (include/dra/torch/elastic/controller.hpp): the gradient reduction
// (bucketed, over the gradient_reducer), the step boundary (commit, what rode with the reduction,
// then a decision or a recovery), and a device loss's deferred read; the world changes themselves are
// in controller.cpp and world.cpp. When the host reads what the device produced (read steps, both
// functions of the step index only, so every member applies a decision at the same boundary):
// docs/design/nccl.md, "Deferred reads".
#include <ATen/Functions.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "deferred_reads.hpp"
#include "dra/error.hpp"
#include "dra/torch/elastic/codec_hook.hpp"
#include "dra/torch/elastic/controller.hpp"
#include "event_log.hpp"
#include "gradient_reducer.hpp"
#include "leader.hpp"
#include "small.hpp"
#include "store_protocol.hpp"

namespace dra::elastic {

using detail::seconds_since;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

// ---- the reduction --------------------------------------------------------------------------------
bool controller::begin_reduction(const std::vector<at::Tensor>& params, const batch_check& check) {
  // A miss found only now (a C++ trainer: Python catches up before its backward) was found after
  // the trainer took its batch, which the sampler then still held for the missed step: stale.
  const bool stale = catch_up_missed_step() && missed_.has_value();
  reduced_ = true;
  batch_ = check;
  if (role_ != role::member || !comm_ || !failure_.empty()) return false;
  if (comm_->size() == 1) {
    // Alone in the world: the gradient already is the global batch's mean; only the loss is queued.
    if (!solo_tail_.defined() || solo_tail_.device() != comm_->device())
      solo_tail_ =
          at::zeros({detail::gradient_reducer::kTail}, at::TensorOptions().dtype(at::kFloat).device(comm_->device()));
    pending_loss_->decision_flag = false;
    pending_loss_->stop = stop_requested();
    detail::write_tail(solo_tail_, *pending_loss_);
    reads_->push(step_index_, solo_tail_);
    if (check.skipped > 0)  // no peer to compare with: this process's own count tells
      refused_ = step_refusal{step_index_, "this process did not train its batch (a caught exception or a `continue`)",
                              check.skipped};
    return false;
  }
  // The leader's "a decision is published" flag rides with the reduction, so that steps without a
  // resize never touch the store.
  pending_loss_->decision_flag = pending_ != nullptr && comm_->rank() == 0;
  pending_loss_->stop = stop_requested();  // a stop request rides along too: every member learns it at once
  pending_loss_->rank = comm_->rank();
  pending_loss_->skipped = check.skipped;
  pending_loss_->in_flight = check.in_flight;
  pending_loss_->micro = check.micro;
  pending_loss_->missed = missed_.has_value();
  pending_loss_->stale = stale;
  reducer_->begin(*comm_, params, sampler_->share_weight(check.micro), *pending_loss_, check.unused_to_none);
  return true;
}

void controller::gradient_ready(std::size_t index) {
  if (reducer_ && reducer_->active()) reducer_->ready(index);
}

bool controller::finish_reduction() {
  if (role_ == role::local) return true;
  if (!reducer_->active()) return failure_.empty() && !refused_ && role_ == role::member;
  at::Tensor tail;
  try {
    tail = reducer_->finish();
    hook(change_phase::reduced);
    reads_->push(step_index_, tail);
  } catch (const dra::error& e) {
    failure_ = e.what();
    comm_->revoke();  // in-flight work stops; NCCL >= 2.28 keeps it shrinkable for the survivors
    return false;
  }
  // A synchronous world reads the tail now: a step in which a rank did not train its batch is
  // refused before any optimizer applies it. (An asynchronous one reports it at its read steps.)
  return comm_->asynchronous() || check_batches(tail);
}

bool controller::check_batches(const at::Tensor& tail) {
  const auto t = detail::read_tail(tail);
  if (t.missed >= 0.5 && !settle_missed_step(t.missed)) return false;
  if (t.stale >= 0.5) {
    // Those ranks' gradients are of the missed step's batch again: nothing is applied, and the
    // step is redone on the batch the sampler now hands out.
    refused_ = step_refusal{step_index_,
                            std::to_string(std::llround(t.stale)) +
                                " rank(s) computed this step on the batch of the step they did not call step() for "
                                "(taken before that step was committed)",
                            0};
    return false;
  }
  const double n = t.depth_ranks;
  const double mean = n > 0 ? t.depth_sum / n : 0.0;
  const bool unequal = n > 1 && t.depth_sq_sum / n - mean * mean > 0.25 / n;
  const double ranks = comm_->size();
  const double micro = t.micro_sum / ranks;
  const bool uneven = ranks > 1 && t.micro_sq_sum / ranks - micro * micro > 0.25 / ranks;
  if (t.skipped < 0.5 && !unequal && !uneven) return true;
  std::string who;
  const auto mask = static_cast<std::uint32_t>(std::llround(t.skip_mask));
  for (int r = 0; r < 24; ++r)
    if ((mask >> r) & 1U) who += (who.empty() ? "" : ", ") + std::to_string(r);
  step_refusal r;
  r.step = step_index_;
  if (uneven && t.skipped < 0.5 && !unequal) {
    r.reason = "the ranks accumulated different numbers of batches (this rank " + std::to_string(batch_.micro) +
               ", the world's mean " + std::to_string(micro) +
               "): a batch prefetched for an earlier world was dropped on some ranks only";
  } else if (!who.empty()) {
    r.reason = "rank(s) " + who + " did not train their batch (a caught exception or a `continue`)";
  } else if (t.skipped >= 0.5) {
    r.reason = std::to_string(std::llround(t.skipped)) + " batch(es) skipped by ranks >= 24";
  } else {
    r.reason = "the ranks hold different numbers of batches in flight (this rank " + std::to_string(batch_.in_flight) +
               ", the world's mean " + std::to_string(mean) + "): a rank skipped a batch";
  }
  r.excess = std::max(batch_.skipped, batch_.in_flight >= 0 && batch_.in_flight > mean + 0.25
                                          ? static_cast<int>(std::ceil(batch_.in_flight - mean - 0.25))
                                          : 0);
  refused_ = std::move(r);
  return false;
}

bool controller::reduce_gradients(const std::vector<at::Tensor>& params) {
  if (begin_reduction(params))
    for (std::size_t i = 0; i < params.size(); ++i) gradient_ready(i);
  return finish_reduction();
}

void controller::average_buffers() {
  if (buffers_.empty() || role_ != role::member || !comm_ || comm_->size() < 2 || !failure_.empty()) return;
  const auto device = comm_->device();
  // One all-reduce in float64 (counts rounded back): the mean of a value every rank holds alike is
  // then that value (sum / 3 in float32 moved 15 % of such values by an ulp). A complex buffer goes
  // as its real view (it was counted as an integer: imaginary part dropped, real part rounded).
  std::vector<at::Tensor> group, flat_parts;
  for (const auto& b : buffers_) group.push_back(b.is_complex() ? at::view_as_real(b.detach()) : b);
  for (const auto& b : group) flat_parts.push_back(b.detach().reshape({-1}).to(device, at::kDouble));
  at::Tensor flat = at::cat(flat_parts);  // a copy: a failed all-reduce leaves the buffers as they were
  try {
    comm_->all_reduce_sum(flat);
  } catch (const dra::error& e) {
    failure_ = std::string("buffer averaging failed: ") + e.what();
    comm_->revoke();
    return;
  }
  flat.div_(static_cast<double>(comm_->size()));
  std::int64_t at = 0;
  for (auto& b : group) {
    at::Tensor part = flat.narrow(0, at, b.numel()).view(b.sizes());
    at += b.numel();
    if (!at::isFloatingType(b.scalar_type())) part = part.round();
    b.detach().copy_(part);
  }
}

void controller::set_bucket_hook(std::shared_ptr<bucket_hook> hook) {
  hook_ = std::move(hook);
  if (reducer_) reducer_->set_hook(hook_);
}

compression_stats controller::compression() const {
  compression_stats s;
  if (!hook_) return s;
  const auto* codecs = dynamic_cast<const codec_hook*>(hook_.get());
  s.codec = codecs ? codecs->spec() : std::string("custom");
  s.bytes = hook_->bytes();
  return s;
}

process_energy controller::energy() const {
  process_energy e;
  if (!meter_) return e;
  e.step_j = meter_->last_step().joules;
  e.job_j = meter_->job().joules;
  e.source = dra::energy::to_string(meter_->job().source);
  e.reader = meter_->reader().name();
  e.scope = meter_->reader().scope();
  return e;
}

detail::job_figures controller::figures() const {
  detail::job_figures f;
  f.energy_step_j = status_.energy_step_j;
  f.energy_job_j = status_.energy_job_j;
  f.energy_source = status_.energy_source;
  const auto c = compression();
  f.compress = c.codec;
  f.bytes_sent = c.bytes.sent;
  f.bytes_dense = c.bytes.dense;
  return f;
}

device_read_stats controller::device_reads() const noexcept {
  return reads_ ? device_read_stats{reads_->reads(), reads_->blocking_waits()} : device_read_stats{};
}

// ---- the step boundary ------------------------------------------------------------------------------
const step_status& controller::step(double loss, const step_signals& extra) {
  return step_impl(nullptr, loss, extra);
}

const step_status& controller::step(const at::Tensor& loss, const step_signals& extra) {
  if (!loss.defined() || loss.numel() != 1)
    dra::detail::throw_invalid("loss", "expected a 0-d tensor (loss.mean() or loss.sum())");
  // One rule on every device: floating point, or an integer taken as its value (as a Python int
  // is); bool and complex are no loss.
  const auto type = loss.scalar_type();
  if (type == at::kBool || at::isComplexType(type) || !(at::isFloatingType(type) || at::isIntegralType(type, false)))
    dra::detail::throw_invalid(
        "loss", std::string("expected a real number (a floating-point or integer tensor), got ") + c10::toString(type));
  if (loss.device().is_cpu()) return step_impl(nullptr, loss.item<double>(), extra);
  if (!at::isFloatingType(type)) {
    const at::Tensor as_float = loss.to(at::kDouble);  // stays on the device: never read here
    return step_impl(&as_float, kNaN, extra);
  }
  return step_impl(&loss, kNaN, extra);
}

const step_status& controller::step_impl(const at::Tensor* device_loss, double loss, const step_signals& extra) {
  extra.validate();
  nonfinite_started_ = false;
  if (!device_loss && role_ != role::local) note_loss(loss);  // alone: noted where fed to the engine
  status_.committed = false;
  status_.decided = false;
  status_.event.clear();
  if (role_ == role::local) {
    step_local(device_loss, loss);
    apply_signals(extra);
    say_if_loss_never_positive();
    return status_;
  }
  if (role_ == role::member) {
    if (!reduced_ && failure_.empty())
      throw std::logic_error(
          "dra: step() without a gradient reduction this step; call reduce_gradients() after backward (Python: call "
          "backward() on the output of controller.model)");
    reduced_ = false;
    refusal_.reset();
    complete_handoff();  // normally done by the optimizer wrapper before its step
    const std::uint64_t events_before = log_->count();
    if (!failure_.empty()) {
      std::string reason = failure_;
      failure_.clear();
      refused_.reset();
      const std::int64_t attempted = step_index_;
      recover(reason);
      if (role_ == role::member && step_index_ == attempted + 1) note_step_taken_over(attempted, reason);
    } else {
      const bool refused = refused_.has_value();
      if (refused) {
        refuse_step();
      } else {
        refusals_in_a_row_ = 0;
        commit(device_loss, loss, extra);
        average_buffers();  // every member commits this step: before a decision changes the world
      }
      // The rows read: up to this step's reduction (a refused step's reduction still carries the
      // previous step's loss and the leader's flag).
      const std::int64_t committed = refused ? step_index_ : step_index_ - 1;
      const bool deferred = comm_->asynchronous();
      try {
        read_reductions(committed);
      } catch (const dra::error& e) {
        // An asynchronous world learns of a dead or hung peer here (its watchdog revoked the
        // communicator): the committed step's update may have used partial sums (docs/design/nccl.md).
        comm_->revoke();
        recover(std::string("reduction failed: ") + e.what());
      }
      // After the optimizer step (the protocol's order), with the signals of this step's loss.
      if (hook_ && role_ == role::member && !refused) hook_->step_committed(engine_.signals());
      // A refused step is no boundary for new decisions (the leader's flag read now still applies).
      if (role_ == role::member && stop_seen_) {
        stop_at_boundary();  // before any decision: a grow would admit joiners into a world that ends
      } else if (role_ == role::member && hold_for_window()) {
        // An accumulation window without no_sync() is open: every member (they run one loop, and a
        // joiner took the accumulation mode with the state) waits for the step that closes it; the
        // leader's flag stays. Steering at exact steps, the leader still decides here (a scheduled
        // size or a decision due at this step was lost), and the decision waits with the word.
        if (options_.capacity_poll_s == 0.0 && comm_ && comm_->rank() == 0 && !pending_ && !refused) leader_decides();
      } else if (role_ == role::member && options_.capacity_poll_s == 0.0 && comm_ && comm_->size() > 1) {
        if (!refused) decide_at_boundary();  // an outside actor steering at exact steps: decided and applied here
      } else if (role_ == role::member && decision_flag_) {
        decision_flag_ = false;  // the leader flagged a decision in a reduction read now: apply it
        apply_decision();
      } else if (role_ == role::member && comm_ && comm_->rank() == 0 && !pending_ && !refused &&
                 (!deferred || decision_point(committed))) {
        leader_decides();
      }
      if (deferred && role_ == role::member && comm_ && read_due(step_index_)) reads_->prefetch();
    }
    if (log_->count() > events_before) status_.event = log_->last();
  }
  if (role_ == role::member && comm_ && comm_->rank() == 0) say_if_loss_never_positive();
  status_.world_size = world_size();
  status_.rank = rank();
  status_.epoch = epoch_;
  status_.exit_requested = exit_requested_;
  if (role_ == role::member) status_.released = false;
  return status_;
}

const step_status& controller::step_local(const at::Tensor* device_loss, double loss) {
  auto feed = [this](std::int64_t step, double value) {
    note_loss(value);
    status_.loss = value;
    if (engine_.step(step, value).decided) {
      status_.decided = true;
      status_.decision = engine_.status().last_decision;
    }
  };
  auto feed_rows = [&](std::int64_t before) {
    for (const auto& r : reads_->take(before, std::chrono::hours(24))) feed(r.step, r.values[0]);
  };
  const std::int64_t index = step_index_++;
  status_.committed = true;
  status_.step = index;
  if (!device_loss) {
    if (!reads_->empty()) feed_rows(index);  // device losses still queued go first, in order
    local_take_due_ = false;
    feed(index, loss);
    return status_;
  }
  reads_->push(index, *device_loss);
  if (local_take_due_) {
    feed_rows(index);  // prefetched one step ago: normally complete
    local_take_due_ = false;
  }
  // The engine decides once it has been fed decide_every more losses: when that loss is queued,
  // start its copy now and feed it at the next step.
  if (engine_.steps_to_decision() <= static_cast<std::int64_t>(reads_->size())) {
    reads_->prefetch();
    local_take_due_ = true;
  }
  return status_;
}

bool controller::decision_point(std::int64_t committed) const {
  return committed >= 0 && (engine_.decision_due(committed + 1) || options_.resize_schedule.count(committed + 1) > 0);
}

bool controller::read_due(std::int64_t committed) const {
  return decision_point(committed) || decision_point(committed - 2);
}

void controller::read_reductions(std::int64_t committed) {
  const bool deferred = comm_->asynchronous();
  if (deferred && !read_due(committed)) return;
  // Synchronous: everything up to this step's reduction. Asynchronous: up to the previous step's.
  const auto rows = reads_->take(deferred ? committed : committed + 1, options_.fault_timeout_ms());
  if (!comm_->healthy()) throw dra::comm_error("the communicator failed while this step's reduction was in flight");
  for (const auto& r : rows) {
    const double count = r.values[1];
    world_loss_known_ = count > 0;
    world_loss_ = world_loss_known_ ? r.values[0] / count : kNaN;
    // A reduction carries the loss of the step committed before it (commit() queues it for the
    // next one): the engine takes it as that step's, as a controller alone does, so that the
    // signals and their messages name the step the loss was computed at.
    if (world_loss_known_) engine_.observe(r.step - 1, world_loss_);
    if (r.values[2] > 0.5) decision_flag_ = true;
    if (r.values[5] > 0.5) stop_seen_ = true;
    note_world_energy(r.values[3], r.values[4] > 0.5);
    const double ranks = comm_->size(), micro = r.values[11] / ranks;
    if (deferred && ranks > 1 && r.values[12] / ranks - micro * micro > 0.25 / ranks && comm_->rank() == 0) {
      std::fprintf(stderr,
                   "[dra] step %lld: the ranks accumulated different numbers of batches (mean %.2f); on an "
                   "asynchronous backend this is reported, not redone: their data positions now differ\n",
                   static_cast<long long>(r.step), micro);
      log_->refused(r.step, epoch_, "uneven gradient accumulation not redone (asynchronous backend)");
    }
    if (deferred && r.values[6] > 0.5 && comm_->rank() == 0) {
      // Read steps only: the step was applied already. Loud, never silent.
      std::fprintf(stderr,
                   "[dra] step %lld: %lld batch(es) were skipped by a rank (a caught exception or a `continue`) and "
                   "their samples were not trained; on an asynchronous backend a skipped batch is reported, not "
                   "redone\n",
                   static_cast<long long>(r.step), static_cast<long long>(std::llround(r.values[6])));
      log_->refused(r.step, epoch_, "skipped batch not redone (asynchronous backend)");
    }
  }
  status_.loss = world_loss_;
}

const step_status& controller::skip_step() noexcept {
  reduced_ = false;
  refused_.reset();
  if (reducer_) reducer_->cancel();
  status_.committed = false;
  status_.decided = false;
  status_.event.clear();
  return status_;
}

// The step is not applied (the optimizer wrappers skipped it) and not committed: the same samples
// are trained again. What its reduction carried (the previous step's loss and energy) was read
// and is not sent again.
void controller::refuse_step() {
  refusal_ = std::move(refused_);
  refused_.reset();
  batch_ = {};
  pending_loss_->count = 0.0;
  pending_loss_->energy_j = 0.0;
  status_.committed = false;
  const int rank = comm_ ? comm_->rank() : 0;
  if (refusal_->excess > 0)
    std::fprintf(stderr,
                 "[dra] rank %d (process %d) did not train %d batch(es) before step %lld (a caught exception or a "
                 "`continue`): the step is refused on every rank and redone\n",
                 rank, uid_, refusal_->excess, static_cast<long long>(refusal_->step));
  if (rank == 0) log_->refused(refusal_->step, epoch_, refusal_->reason);
  if (++refusals_in_a_row_ >= 4)
    throw dra::state_mismatch_error("dra: step " + std::to_string(refusal_->step) + " was refused " +
                                    std::to_string(refusals_in_a_row_) + " times in a row: " + refusal_->reason +
                                    "; give every rank the same DataLoader settings and let every rank step every "
                                    "batch it is handed");
}

void controller::note_world_energy(double joules, bool estimated) {
  world_energy_j_ += joules;
  world_energy_known_ = true;
  if (estimated) world_energy_measured_ = false;
  status_.energy_step_j = joules;
  status_.energy_job_j = world_energy_j_;
  status_.energy_source = world_energy_measured_ ? "measured" : "estimated";
}

void controller::commit(const at::Tensor* device_loss, double loss, const step_signals& extra) {
  const auto share = static_cast<double>(sampler_->share_range().size());
  // A non-finite loss travels as such: the world's mean is then non-finite and the engine counts it.
  *pending_loss_ = {};
  if (device_loss) pending_loss_->loss = device_loss->detach();
  pending_loss_->loss_value = loss;
  pending_loss_->count = share;
  if (meter_) {
    // This process's energy of the step rides with the next reduction, like its loss.
    const auto& e = meter_->mark(seconds_since(detail::clock_type::time_point{}));
    pending_loss_->energy_j = e.joules;
    pending_loss_->energy_measured = e.source == dra::energy::energy_source::measured;
  }
  const auto samples = sampler_->samples(batch_.micro);
  sampler_->commit(batch_.micro);
  batch_ = {};
  const std::int64_t committed = step_index_++;
  apply_signals(extra);
  samples_ += samples;
  log_->status.committed(samples);
  status_.committed = true;
  status_.step = committed;
  status_.loss = world_loss_;
  if (comm_ && comm_->rank() == 0)
    log_->status.maybe_print(step_index_, options_.status_every, world_loss_, world_size(), figures());
}

void controller::resume_at(std::int64_t step_index) {
  if (step_index < 0) dra::detail::throw_invalid("step_index", "must be >= 0, got " + std::to_string(step_index));
  if (step_index_ != 0 && step_index_ != step_index)
    throw std::logic_error("dra: resume_at() after training started (step " + std::to_string(step_index_) +
                           "); call it right after the controller is made, on every process");
  step_index_ = step_index;
}

void controller::apply_signals(const step_signals& x) {
  auto& est = engine_.estimator();
  // Non-finite norms are counted by the estimator; equal batches (a world of one) carry no statistics.
  if (!std::isnan(x.small_batch) && x.big_batch > x.small_batch)
    est.update_gradients(x.small_sqr_norm, x.small_batch, x.big_sqr_norm, x.big_batch);
  if (!std::isnan(x.validation)) est.update_validation(x.validation);
  // The first step committed in a world is not timed: a step during which the world changed
  // (a fault recovered inside it, a joiner's handoff, the new world's first connections) timed
  // the change, not a step of either size. One such step (seconds, against milliseconds) at a
  // size just reached set that size's fit, and a pool shrank a healthy job on it.
  const bool same_world = timed_epoch_ == epoch_;
  timed_epoch_ = epoch_;
  if (same_world && !std::isnan(x.step_time_s)) {
    const auto& w = engine_.world();
    engine_.throughput().observe(w.size, w.global_batch / std::max(w.size, 1), x.step_time_s,
                                 std::isnan(x.sync_time_s) ? 0.0 : x.sync_time_s);
  }
}

}  // namespace dra::elastic
