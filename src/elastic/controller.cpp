// The controller's state machine (include/dra/torch/elastic/controller.hpp): construction, the
// step boundary and the decisions it applies. The world changes themselves (entering a world,
// the handoff, admission, leaving, recovery) are in world.cpp. Each collaborator does one thing:
//   store_protocol   every agreement over the job's store (store_protocol.hpp lists the keys)
//   leader           rank 0's decisions and its look at the outside (leader.hpp)
//   handoff          the state to joiners over the backend's tensor_transfer
//   gradient_reducer the per-step all-reduce (gradients + loss + the decision flag)
//   event_log        events and the status line
// States: local (no world) | candidate -> member <-> (resize | recovery) -> released | finished |
// rejected.
#include "dra/torch/elastic/controller.hpp"

#include <ATen/Functions.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>

#include "deferred_reads.hpp"
#include "dra/error.hpp"
#include "dra/torch/elastic/codec_hook.hpp"
#include "event_log.hpp"
#include "gradient_reducer.hpp"
#include "handoff.hpp"
#include "leader.hpp"
#include "small.hpp"
#include "store_protocol.hpp"

namespace dra::elastic {

using detail::change_cause;
using detail::clock_type;
using detail::contains;
using detail::seconds_since;
using detail::world_change;

controller::controller(controller_options options)
    : options_((options.adopt_deprecated_names(), options.validate(), std::move(options))),
      engine_(options_.engine),
      log_(std::make_unique<detail::event_log>("")) {
  reads_ = std::make_unique<detail::deferred_reads>();
  members_ = {0};
  status_.world_size = 1;
  status_.rank = 0;
  status_.signals = &engine_.signals();
}

controller::controller(controller_options options, launch_info launch, std::shared_ptr<state_provider> state,
                       std::shared_ptr<elastic_sampler> sampler)
    : options_((options.adopt_deprecated_names(), options.validate(), std::move(options))),
      engine_(options_.engine),
      state_(std::move(state)),
      sampler_(std::move(sampler)),
      reducer_(std::make_unique<detail::gradient_reducer>()),
      log_(std::make_unique<detail::event_log>(options_.events_path)) {
  pending_loss_ = std::make_unique<detail::tail_input>();
  reads_ = std::make_unique<detail::deferred_reads>();
  if (!state_) dra::detail::throw_invalid("state", "a state_provider is required (module_state for LibTorch models)");
  if (!sampler_) dra::detail::throw_invalid("sampler", "an elastic_sampler is required");
  // The job's seed (the sampler's) seeds the codecs: RigL's tie keys, random masks, PowerSGD's Q.
  if (!options_.compress.empty())
    set_bucket_hook(std::make_shared<codec_hook>(options_.compress, sampler_->seed(), options_.sparsity));
  launch.validate();
  detail::ignore_default_sigpipe();
  backend_ = comm::make_backend(options_.backend, {options_.backend_address, "pg"});
  if (!options_.release) options_.release = backend_->uses_device() ? release_mode::exit : release_mode::standby;
  transfer_ = backend_->make_transfer(options_.chunk_size_bytes());
  if (!transfer_)
    dra::detail::throw_invalid(
        "backend", "'" + options_.backend +
                       "' cannot hand state to joiners (its make_transfer() gave none: no point-to-point); use "
                       "'gloo', or give that backend's communicator send/recv and a transfer (docs/guide/backend.md, "
                       "'Your own backend')");
  store_ = std::make_unique<detail::store_protocol>(launch, options_.store_timeout_ms());
  // The leader touches the store inside its step while its peers wait in the next collective: a
  // reconnection (a store that closed the connection, or one dying) stays well inside their fault
  // timeout, so that a store's death alone never makes the world declare its leader dead.
  store_->bound_reconnects(
      std::clamp(options_.fault_timeout_ms() / 4, std::chrono::milliseconds(100), std::chrono::milliseconds(2000)));
  leader_ = std::make_unique<detail::leader>(*store_, engine_, options_, *log_);
  role_ = role::candidate;
  joined_late_ = launch.join;
  if (launch.join) {
    // From 10000 up: never a rank torchrun handed out. A launcher may have claimed it already.
    uid_ = launch.join_uid >= 0 ? launch.join_uid : store_->claim_late_uid();
    universe_size_ = store_->universe(launch.universe_size);
  } else {
    uid_ = launch.uid;
    universe_size_ = launch.universe_size;
    if (uid_ == 0) store_->set_universe(universe_size_);
  }
  {
    // Liveness for a recovery: a member that stopped beating for half the fault timeout is dead
    // (the survivors go on without waiting out the window); one that beats but checks in late is
    // given two more fault timeouts: a live member can be held that long by a rendezvous that
    // times out (2 x fault_timeout_s) after the one that opened the room failed at once (the
    // faults campaign's trial 578:kill_in_resize:cpp left a live member out after one).
    using std::chrono::milliseconds;
    const milliseconds ft = options_.fault_timeout_ms();
    const milliseconds interval = std::clamp(ft / 10, milliseconds(50), milliseconds(1000));
    store_->start_heartbeat(uid_, interval, std::max(ft / 2, 5 * interval), 2 * ft);
  }
  start_size_ = options_.fit_to_job(universe_size_);
  engine_ = resize_engine(options_.engine);  // with the job's limits (the leader holds a reference)
  status_.signals = &engine_.signals();
  signature_ = state_->signature();
  layout_ = state_->layout();
  layout_["codec"] = hook_ ? compression().codec : "none";
  std::vector<int> others = {0};
  if (!joined_late_) {
    others.clear();
    for (int u = 0; u < universe_size_; ++u) others.push_back(u);
  }
  store_->check_consistency(uid_, detail::config_fingerprint(options_, *sampler_, start_size_), signature_, layout_,
                            others, !joined_late_);
  if (!launch.join && uid_ < start_size_) {
    world_change start;
    for (int u = 0; u < start_size_; ++u) start.members.push_back(u);
    start.reason = "start";
    holds_state_ = true;  // founding members: the leader's state wins in the first handoff
    enter_world(start);
  } else if (options_.release == release_mode::to_caller) {
    // release="return": a process outside the first world is with its caller from the start (an
    // RL slot that begins as a rollout worker); it asks to enter with rejoin() or try_join().
    role_ = role::released;
    status_.released = true;
  } else {
    wait_for_admission();
  }
}

controller::~controller() {
  if (deferred_) deferred_->wait();  // its thread uses the communicator
}

int controller::rank() const noexcept {
  if (role_ == role::local) return 0;
  if (comm_) return comm_->rank();
  return role_ == role::finished ? final_rank_ : -1;  // after the end: the last world's rank
}
int controller::world_size() const noexcept {
  if (role_ == role::local) return 1;
  if (comm_) return comm_->size();
  return role_ == role::finished ? final_size_ : 0;
}
const std::string& controller::last_event() const noexcept {
  return log_->last();
}
const std::vector<std::string>& controller::events() const noexcept {
  return log_->lines();
}
std::string controller::store_address() const {
  return store_ ? store_->address() : std::string();
}
std::vector<int> controller::registered_candidates() {
  return store_ ? store_->registered_candidates() : std::vector<int>{};
}
std::uint64_t controller::state_digest() {
  return state_ ? elastic::state_digest(*state_) : 0;
}
void controller::hook(change_phase phase) {
  if (options_.phase_hook) options_.phase_hook(phase, *this);
}

bool controller::next_epoch(std::int64_t num_epochs) {
  num_epochs_ = num_epochs;
  if (role_ == role::member && sampler_->exhausted() && sampler_->epoch() < num_epochs) sampler_->next_epoch();
  if (role_ == role::member && sampler_->epoch() < num_epochs) return true;
  finish();
  return false;
}

void controller::finish() noexcept {
  if (role_ != role::member || !comm_) return;
  try {
    complete_handoff();
    // Said before the barrier: a member still training (its loop went past this step) learns it
    // at its recovery instead of training on alone (refuse_to_train_past_the_loops_end).
    store_->mark_loop_ended(epoch_, uid_, step_index_);
    comm_->barrier();
    if (comm_->rank() == 0) {
      detail::event_log::print_summary(step_index_, comm_->size(), figures());
      store_->mark_done(members_, stopped_ ? std::optional<std::int64_t>(step_index_) : std::nullopt);
      // Standbys learn the end from the store. When this process hosts it (rank 0 outside the
      // torchrun agent), leaving at once would take the store away before they read "done": wait
      // (bounded) until every waiting candidate withdrew. Meanwhile "done" is written again
      // whenever another client wrote over it: a standby that read that value instead would wait
      // for an admission forever (seen in 1,000-trial campaigns of outside store writers). The
      // candidates are those registered now, every one seen before and every former member (a
      // candidates' list written over reads as empty); a standby on a loaded host may poll late:
      // two fault timeouts. When another client has written into this job's keys, "done" is kept
      // for a little longer than a candidate takes to register again (1 s), so that a candidate
      // this process never saw is still told.
      const auto start = clock_type::now();
      const auto deadline = start + 2 * options_.fault_timeout_ms() + std::chrono::seconds(1);
      const auto keep_until = start + std::chrono::milliseconds(1500);
      for (;;) {
        const bool waiting = store_->any_waiting(members_);  // reads the list: a value written over is warned
        const auto now = clock_type::now();
        if (now >= deadline || (!waiting && !(store_->tampered() && now < keep_until))) break;
        if (!store_->done())
          store_->mark_done(members_, stopped_ ? std::optional<std::int64_t>(step_index_) : std::nullopt);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  } catch (const std::exception& e) {
    // A peer or the store already gone at the very end changes nothing: training is over.
    std::fprintf(stderr, "[dra] process %d finished; the job's end could not be announced: %s\n", uid_, e.what());
  }
  final_rank_ = comm_->rank();
  final_size_ = comm_->size();
  comm_.reset();
  role_ = role::finished;
}

void controller::stop_at_boundary() noexcept {
  // Every member read the same reduction, so every member is here at this same boundary.
  stop_seen_ = false;
  pending_.reset();  // a decision not applied: its joiners learn the job's end from the store
  decision_flag_ = false;
  stopped_ = true;
  if (comm_ && comm_->rank() == 0) {
    std::printf("[dra] stop requested: training ends at step %lld on every member (world %d)\n",
                static_cast<long long>(step_index_), comm_->size());
    std::fflush(stdout);
  }
  finish();
}

void controller::abandon(const std::string& why) noexcept {
  if (role_ == role::local || role_ == role::finished || role_ == role::rejected || !store_) return;
  try {
    if (deferred_) deferred_->wait();  // its thread uses the communicator
    deferred_.reset();
    if (comm_) comm_->revoke();  // the peers' collectives fail now, not after fault_timeout_s
    comm_.reset();
    if (role_ == role::candidate || role_ == role::released) store_->withdraw(uid_);
  } catch (const std::exception&) {
    // Leaving anyway.
  }
  store_->mark_gone(uid_);
  std::fprintf(stderr, "[dra] process %d leaves the job mid-training: %s\n", uid_, why.c_str());
  std::fflush(stderr);
  role_ = role::finished;
}

// ---- the loss each step() is given ---------------------------------------------------------------
void controller::say_if_loss_never_positive() {
  // The loss-trend signals fit log(loss): a loss that is never positive (a negative log-likelihood
  // bound, a reward to maximise passed as its negative) leaves them empty, and the phase stays
  // warmup for the whole run. Said once, when the warmup would have ended.
  const auto& s = engine_.signals();
  say_if_loss_turned_nonpositive(s);
  if (nonpositive_said_) return;
  if (s.accepted < std::max<std::uint64_t>(engine_.config().estimator.warmup_steps, 1) ||
      s.nonpositive_count != s.accepted)
    return;
  nonpositive_said_ = true;
  std::fprintf(stderr,
               "[dra] step %lld: every loss so far (%llu steps, the latest %g) is <= 0: the convergence signals fit "
               "log(loss), so the loss trend and plateau stay empty and the phase stays warmup; pass dra.step a "
               "quantity that is positive and falls as training converges (e.g. loss minus a known lower bound) "
               "(said once)\n",
               static_cast<long long>(s.step), static_cast<unsigned long long>(s.accepted), s.loss);
  std::fflush(stderr);
}

void controller::say_if_loss_turned_nonpositive(const dra::signals::convergence_signals& s) {
  // A loss that falls below zero mid-run (a negative log-likelihood of a continuous density, an
  // ELBO) stops feeding the log(loss) regression: once a whole window of losses is <= 0 the trend,
  // the plateau flag and the phase are those of the last positive window, frozen, and the policy
  // keeps acting on them (growing on a frozen "fast", releasing on a frozen "plateau"). Said once.
  if (s.accepted == accepted_seen_) return;
  const std::uint64_t fed = s.accepted - accepted_seen_, nonpositive = s.nonpositive_count - nonpositive_seen_;
  nonpositive_run_ = nonpositive == fed ? nonpositive_run_ + fed : nonpositive;
  accepted_seen_ = s.accepted;
  nonpositive_seen_ = s.nonpositive_count;
  const std::uint64_t window = engine_.config().estimator.window;
  if (nonpositive_run_said_ || nonpositive_run_ < window || s.nonpositive_count == s.accepted) return;
  nonpositive_run_said_ = true;
  std::fprintf(stderr,
               "[dra] step %lld: the latest %llu losses (the latest %g) are <= 0 after positive ones: the convergence "
               "signals fit log(loss), so the loss trend and the phase (%s) stay as they were at the last positive "
               "loss while the policy acts on them; pass dra.step a quantity that stays positive and falls as "
               "training converges (e.g. loss minus a known lower bound) (said once)\n",
               static_cast<long long>(s.step), static_cast<unsigned long long>(nonpositive_run_), s.loss,
               dra::signals::to_string(s.phase));
  std::fflush(stderr);
}

void controller::note_loss(double loss) {
  input_nonfinite_streak_ = std::isfinite(loss) ? 0 : input_nonfinite_streak_ + 1;
  if (input_nonfinite_streak_ == 1) nonfinite_started_ = true;
}

// ---- decisions (the leader publishes, every member reads) ----------------------------------------
void controller::leader_decides() {
  const auto t0 = clock_type::now();
  std::vector<int> flapping;
  for (const auto& [uid, n] : fault_leaves_)
    if (n >= 2) flapping.push_back(uid);
  const int heal_size = heal_size_ > static_cast<int>(members_.size()) ? heal_size_ : 0;
  auto d = leader_->decide({step_index_, epoch_, members_, signature_, layout_, sampler_->global_batch(), samples_,
                            world_loss_, heal_size, std::move(flapping)});
  if (leader_->decided()) {
    status_.decided = true;
    status_.decision = leader_->last();
  }
  if (!d) return;
  pending_ = std::make_unique<detail::published_decision>(std::move(*d));
  decide_s_ = seconds_since(t0);
  if (comm_->size() == 1) apply_decision();  // no peers to tell: apply at this boundary
}

void controller::decide_at_boundary() {
  // With capacity_poll_s = 0 the leader looks outside at every step, and a change it decides is
  // applied at this same boundary: every member waits for the leader's word (one store round
  // trip), instead of learning of the decision from the next step's reduction.
  const std::int64_t at = step_index_;
  bool decided = false;
  try {
    if (comm_->rank() == 0) {
      if (!pending_) leader_decides();
      decided = pending_ != nullptr;
      store_->publish_boundary(epoch_, at, decided);
    } else {
      decided = store_->read_boundary(epoch_, at, options_.fault_timeout_ms() + std::chrono::seconds(1));
    }
  } catch (const dra::error& e) {
    if (comm_) comm_->abort();
    recover("the leader's word at step " + std::to_string(at) + " not received: " + e.what());
    return;
  }
  if (decided) apply_decision();
}

void controller::apply_decision() {
  const auto t0 = clock_type::now();
  detail::published_decision d;
  const bool leader = comm_ && comm_->rank() == 0 && pending_;
  std::string failed;
  bool store_gone = false;
  try {
    if (leader) {
      d = *pending_;
      store_->admit(d.decision.join, {d.epoch, d.decision.members, d.decision.join});
    } else {
      d = store_->read_decision(epoch_, options_.fault_timeout_ms() + std::chrono::seconds(1));
    }
  } catch (const dra::error& e) {
    failed = e.what();
    store_gone = store_->gone();
  }
  // Every member is at this boundary: one small all-reduce tells whether each one holds the
  // decision. A store that died between the decision's publication and its reading leaves some or
  // all without it, and no world change can go through a dead store: then every member skips the
  // decision and the world trains on at its size. Any other failure is recovered from, by all.
  if (comm_ && comm_->size() > 1) {
    at::Tensor misses = at::zeros({2}, at::kFloat);
    if (!failed.empty()) misses[store_gone ? 0 : 1] = 1.0;
    try {
      comm_->all_reduce_sum(misses);
    } catch (const dra::error& e) {
      comm_->abort();
      recover("agreeing on the decision of epoch " + std::to_string(epoch_) + ": " + e.what());
      return;
    }
    const float gone = misses[0].item<float>(), other = misses[1].item<float>();
    if (other == 0.0f && gone > 0.0f) {
      pending_.reset();
      decision_flag_ = false;
      std::fprintf(stderr,
                   "[dra] decision of epoch %lld skipped on every member: the store is gone for %d of %d (%s); "
                   "the world trains on at size %d\n",
                   static_cast<long long>(epoch_), static_cast<int>(gone), comm_->size(),
                   failed.empty() ? "this process read it" : failed.c_str(), comm_->size());
      std::fflush(stderr);
      return;
    }
    if (other > 0.0f && failed.empty()) failed = "another member could not read it";
  }
  if (!failed.empty()) {
    if (comm_) comm_->abort();
    recover("decision of epoch " + std::to_string(epoch_) + " not received: " + failed);
    return;
  }
  pending_.reset();
  decision_flag_ = false;
  const auto& dec = d.decision;
  status_.decided = true;
  status_.decision = dec;
  if (dec.batch_scale != 1.0) {
    sampler_->set_global_batch(
        std::max<std::int64_t>(1, std::llround(static_cast<double>(sampler_->global_batch()) * dec.batch_scale)));
    state_->scale_learning_rate(dec.lr_scale);
  }
  if (contains(dec.leave, uid_)) {
    leave(options_.release == release_mode::exit);
    return;
  }
  if (!follows(epoch_, d.epoch)) return;
  world_change c(change_cause::resize, d.epoch, dec.members);
  c.joined = dec.join;
  c.left = dec.leave;
  c.reason = dec.reason;
  c.before = static_cast<int>(members_.size());
  c.agree_s = seconds_since(t0) + (leader ? decide_s_ : 0.0);
  c.decided_step = d.decided_step;
  try {
    enter_world(c);
  } catch (const dra::error& e) {
    recover("resize to epoch " + std::to_string(d.epoch) + " failed: " + e.what());
  }
}

}  // namespace dra::elastic
