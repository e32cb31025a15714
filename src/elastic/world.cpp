// The controller's world changes (include/dra/torch/elastic/controller.hpp): a world change of any
// cause (start, admission, resize, recovery) is one world_change value carried through the same
// phases of enter_world: rebuild (the backend builds the epoch's communicator), state transfer
// (along detail::route_handoff), reshard (the sampler's world and rank, the first collective, the
// optional digest check). Also: a candidate's wait and admission, leaving, and the recovery.
#include <ATen/Functions.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>

#include "../comm/descriptors.hpp"
#include "deferred_reads.hpp"
#include "dra/energy/readers.hpp"
#include "dra/error.hpp"
#include "dra/torch/elastic/controller.hpp"
#include "event_log.hpp"
#include "gradient_reducer.hpp"
#include "handoff.hpp"
#include "small.hpp"
#include "store_protocol.hpp"

namespace dra::elastic {

using detail::change_cause;
using detail::clock_type;
using detail::contains;
using detail::seconds_since;
using detail::world_change;

// ---- admission and world changes --------------------------------------------------------------
void controller::wait_for_admission() {
  for (;;) {
    role_ = role::candidate;
    holds_state_ = false;
    store_->register_candidate(uid_, signature_, layout_);
    if (admitted(store_->wait_for_admission(uid_, options_.interrupt_check))) return;
  }
}

// Acts on how a candidate's wait ended; false when it must register and wait again.
bool controller::admitted(const detail::admission_result& r) {
  registered_ = false;
  if (r.what == detail::admission_result::outcome::done) {
    role_ = role::finished;
    sampler_->finish();
    return true;
  }
  if (r.what == detail::admission_result::outcome::rejected) {
    role_ = role::rejected;
    throw dra::state_mismatch_error("dra: admission refused by the world: " + r.why);
  }
  if (r.what == detail::admission_result::outcome::dismissed) {
    // Its device is being taken back before it was admitted: it leaves as a released member
    // would (release="exit": exits 0); a standby registers and waits again.
    // A standby registers again, and is dismissed again at each of the leader's looks while the
    // outside actor still names it: said once per reason.
    if (r.why != last_dismissal_) {
      std::printf("[dra] process %d dismissed before admission: %s\n", uid_, r.why.c_str());
      std::fflush(stdout);
      last_dismissal_ = r.why;
    }
    if (options_.release == release_mode::standby) return false;
    leave(options_.release == release_mode::exit);
    return true;
  }
  // Admitted into a recovery's world: like the survivors, it takes the state from rank 0.
  world_change admit(r.admitted.recovery ? change_cause::fault : change_cause::admit, r.admitted.epoch,
                     r.admitted.members);
  admit.joined = r.admitted.joined;
  try {
    enter_world(admit);
  } catch (const dra::error& e) {
    // A peer died while this process joined: it is in the world being formed, so it takes part
    // in the recovery, as one that holds no state yet unless its handoff completed (the agreed
    // world is then led by a process that holds it, and hands it over).
    recover(std::string("joining epoch ") + std::to_string(admit.epoch) + " failed: " + e.what());
  }
  return true;
}

void controller::complete_handoff() {
  if (!deferred_) return;
  const auto t0 = clock_type::now();
  const std::string error = deferred_->wait();
  handoff_stats_.wait_s = seconds_since(t0);
  handoff_stats_.deferred_s = deferred_->duration_s();
  auto done = std::move(deferred_);
  if (!error.empty()) {
    if (done->receiver()) holds_state_ = false;
    if (failure_.empty()) failure_ = "deferred state handoff failed: " + error;
    return;
  }
  if (done->receiver()) state_->load(done->manifest(), done->targets());
}

bool controller::rejoin() {
  if (role_ != role::released)
    throw std::logic_error(std::string("dra: rejoin() is for a released process; this one is ") + to_string(role_));
  wait_for_admission();
  return role_ == role::member;
}

bool controller::try_join() {
  if (role_ == role::member) return true;
  if (role_ != role::released && role_ != role::candidate) return false;
  if (!registered_) {
    role_ = role::candidate;
    holds_state_ = false;
    store_->register_candidate(uid_, signature_, layout_);
    registered_ = true;
  }
  const auto r = store_->poll_admission(uid_, true);
  if (!r) return false;
  admitted(*r);
  return role_ == role::member;
}

void controller::start_energy_meter() {
  if (!meter_) {
    // A per-process reader, so that the world's sum counts each process once: NVML for this
    // process's CUDA device, else its CPU time x a stated power (estimated). RAPL is left out: it
    // covers a whole package, which every process on the node would count again.
    std::unique_ptr<dra::energy::energy_reader> reader;
    if (comm_ && comm_->device().is_cuda()) {
      try {
        reader =
            std::make_unique<dra::energy::nvml_reader>("libnvidia-ml.so.1", std::vector<int>{comm_->device().index()});
      } catch (const dra::error&) {
      }
    }
    if (!reader) reader = std::make_unique<dra::energy::cpu_model_reader>(&dra::energy::process_cpu_seconds);
    meter_ = std::make_unique<dra::energy::energy_meter>(std::move(reader));
  }
  meter_->skip(seconds_since(clock_type::time_point{}));  // time out of the world is not the job's
}

void controller::enter_world(const world_change& change) {
  const auto t0 = clock_type::now();
  const bool was_member = role_ == role::member;
  // Members and epoch first: when the build fails, the recovery runs for this new epoch.
  const std::vector<int> old_members = members_;
  members_ = change.members;
  if (store_) store_->note_members(members_);  // a member stood by later waits as a candidate
  epoch_ = change.epoch;
  if (device_released_) {
    state_->restore_device();  // a standby admitted again: its state comes back to the device
    device_released_ = false;
  }
  reducer_->cancel();
  reads_->reset();
  // Marked on the store until the backend returns the new world: a recovery that opens meanwhile
  // waits for this member, which beats, past its late grace (agree_on_survivors). A rebuild that
  // fails leaves the mark: this process is on its way to the recovery, where it checks in.
  store_->rebuilding(uid_, change.epoch);
  hook(change_phase::rebuild);
  comm::rebuild_request request;
  request.epoch = static_cast<std::uint64_t>(change.epoch);
  request.new_members = change.members;
  request.self = uid_;
  request.abortive = change.cause == change_cause::fault;
  request.timeout = 2 * options_.fault_timeout_ms();
  request.collective_timeout = options_.fault_timeout_ms();
  if (comm_) {
    request.old_members = old_members;  // a communicator is passed with its members
  } else if (change.cause != change_cause::start &&
             std::find(change.joined.begin(), change.joined.end(), uid_) != change.joined.end()) {
    // A joiner: the world it joins, as far as the change tells (its members without the joiners).
    // NCCL's rebuild needs every new member to see a previous world: they all vote on the fast path
    // (a grow) or all fall back to a fresh init.
    for (int uid : change.members)
      if (std::find(change.joined.begin(), change.joined.end(), uid) == change.joined.end())
        request.old_members.push_back(uid);
  }
  comm_ = backend_->rebuild(std::move(comm_), request, store_->store());
  store_->rebuilt(uid_);
  if (!comm_)
    throw dra::membership_error("dra: process " + std::to_string(uid_) + " is not in epoch " +
                                std::to_string(change.epoch));
  const double rebuild_s = seconds_since(t0);

  const auto t1 = clock_type::now();
  hook(change_phase::state_transfer);
  std::uint64_t nbytes = 0, skipped_bytes = 0;
  complete_handoff();  // a deferred part of an earlier change lands first
  hand_over_state(change, nbytes, skipped_bytes);
  const double transfer_s = seconds_since(t1);

  const auto t2 = clock_type::now();
  hook(change_phase::reshard);
  sampler_->set_world(comm_->size(), comm_->rank());
  pending_.reset();
  decision_flag_ = false;
  {
    // The last committed step's energy still rides with the first reduction of the new world.
    const detail::tail_input keep = *pending_loss_;
    *pending_loss_ = {};
    pending_loss_->energy_j = keep.energy_j;
    pending_loss_->energy_measured = keep.energy_measured;
  }
  if (hook_) {
    const bool joiner = std::find(change.joined.begin(), change.joined.end(), uid_) != change.joined.end();
    hook_->world_changed(change.cause == change_cause::fault ? hook_transition::recovered
                         : joiner                            ? hook_transition::joined
                                                             : hook_transition::survived);
  }
  if (!was_member) start_energy_meter();
  world_loss_ = std::numeric_limits<double>::quiet_NaN();
  world_loss_known_ = false;
  comm_->barrier();  // the first collective of the new world
  std::optional<bool> identical;
  if (options_.verify) {
    const std::uint64_t mine = state_digest();
    last_digest_ = mine;
    at::Tensor leader = at::full({1}, static_cast<std::int64_t>(mine), at::kLong);
    comm_->broadcast(leader, 0);
    at::Tensor differs = at::full({1}, leader.item<std::int64_t>() == static_cast<std::int64_t>(mine) ? 0.0 : 1.0);
    comm_->all_reduce_sum(differs);
    identical = differs.item<double>() == 0.0;
  }
  const double reshard_s = seconds_since(t2);
  role_ = role::member;
  holds_state_ = true;
  missed_.reset();  // a world just entered holds one state: a step missed before it is settled
  failure_.clear();
  running_members_ = members_;
  log_->status.restart();
  engine_.resized(comm_->size(), static_cast<double>(sampler_->global_batch()));
  engine_.world().active = members_;
  if (change.cause == change_cause::fault) {
    // A fault is no decision: the size before it stays the one to heal back to (options.heal).
    // A fault that interrupted a decided shrink heals to that shrink's size: the shrink was a
    // decision, and like any decision it sets the size anew (before, the world grew back and
    // re-admitted the member the shrink had released).
    if (change.heal_to > 0 && change.heal_to < change.before)
      heal_size_ = change.heal_to;
    else
      heal_size_ = std::max(heal_size_, change.before);
    for (int u : change.left) ++fault_leaves_[u];
  } else {
    heal_size_ = comm_->size();
  }
  if (change.cause != change_cause::start) ++resizes_;
  if (change.cause == change_cause::admit || comm_->rank() != 0) return;
  detail::world_event ev;
  ev.change = change;
  ev.step = step_index_;
  ev.data_epoch = sampler_->epoch();
  ev.after = comm_->size();
  ev.rebuild_s = rebuild_s;
  ev.transfer_s = transfer_s;
  ev.reshard_s = reshard_s;
  ev.state_bytes = nbytes;
  ev.skipped_bytes = skipped_bytes;
  ev.deferred_bytes = handoff_stats_.deferred_bytes;
  ev.global_batch = sampler_->global_batch();
  ev.batch_mode = options_.batch == batch_mode::adascale ? "adascale" : "fixed";
  ev.params_identical = identical;
  ev.backend = backend_->name();
  ev.figures = figures();
  if (change.cause == change_cause::start) ev.release = to_string(options_.release.value_or(release_mode::standby));
  log_->world(ev);
}

void controller::hand_over_state(const world_change& change, std::uint64_t& nbytes, std::uint64_t& skipped_bytes) {
  const auto route = detail::route_handoff(change, comm_->rank(), comm_->size(), uid_);
  // A grow may defer (handoff="deferred"); a start or a recovery hands everything over at once.
  const bool defer =
      options_.deferred_handoff && change.cause != change_cause::start && change.cause != change_cause::fault;
  handoff_stats_ = {};  // this change's handoff (none for a member that neither sends nor receives)
  auto note = [&](const detail::handoff_result& r) {
    handoff_stats_.deferred = r.deferred != nullptr;
    handoff_stats_.bytes = r.bytes;
    handoff_stats_.skipped_bytes = r.skipped_bytes;
    handoff_stats_.deferred_bytes = r.deferred ? r.deferred->bytes() : 0;
  };
  if (route.receive_from >= 0) {
    detail::handoff_header h;
    auto r = detail::recv_state(*comm_, *transfer_, route.receive_from, *state_, h, defer);
    nbytes = r.bytes;
    skipped_bytes = r.skipped_bytes;
    note(r);
    deferred_ = std::move(r.deferred);
    step_index_ = h.step_index;
    sampler_->set_position(h.sampler);
    if (h.num_epochs >= 0) num_epochs_ = h.num_epochs;
    resizes_ = h.resizes;
    world_energy_j_ = h.energy_j;
    world_energy_known_ = h.energy_known;
    world_energy_measured_ = h.energy_measured;
    if (hook_) {
      hook_->load_shared_state(h.hook_state);
    } else if (!h.hook_state.empty()) {
      throw dra::state_mismatch_error(
          "dra: the world reduces gradients through a bucket hook (codec) and this process has none; give every "
          "process the same `compress` option (or set_bucket_hook)");
    }
    holds_state_ = true;
  }
  if (!route.send_to.empty()) {
    detail::handoff_header h;
    h.step_index = step_index_;
    h.sampler = sampler_->position();
    h.num_epochs = num_epochs_;
    h.resizes = resizes_;
    h.energy_j = world_energy_j_;
    h.energy_known = world_energy_known_;
    h.energy_measured = world_energy_measured_;
    if (hook_) h.hook_state = hook_->shared_state();
    auto r = detail::send_state(*comm_, *transfer_, route.send_to, *state_, h, defer);
    nbytes = r.bytes;
    skipped_bytes = r.skipped_bytes;
    note(r);
    deferred_ = std::move(r.deferred);
  }
}

void controller::leave(bool exit) {
  complete_handoff();  // a deferred handoff uses the communicator
  comm_.reset();       // a voluntary change: the old world is idle at this step boundary
  role_ = role::released;
  members_.clear();
  running_members_.clear();
  reads_->reset();
  if (exit) {
    std::printf("[dra] process %d released at step %lld: exiting to give the device back\n", uid_,
                static_cast<long long>(step_index_));
    std::fflush(stdout);
    exit_requested_ = true;
    sampler_->finish();
    return;
  }
  // Standing by or back to the caller: the device's memory goes back (a standby never holds a device
  // another job could use).
  state_->release_device();
  device_released_ = true;
  if (options_.release == release_mode::to_caller) {
    status_.released = true;  // back to the caller, who may rejoin() later
    return;
  }
  wait_for_admission();
}

// ---- faults -------------------------------------------------------------------------------------
namespace {
// What a process that leaves the world does next, as its messages say it.
const char* what_leaving_does(const std::optional<release_mode>& release) {
  return release == release_mode::exit      ? "exiting"
         : release == release_mode::standby ? "standing by"
                                            : "returning to the caller";
}
}  // namespace

// The world of `child` follows the world of `parent`. When another world followed it already, this
// process's group of survivors was split from the others (another client wrote over a key they
// agreed through, so they read different results): it steps out (stands by, or exits) rather than
// train on as a second world over the same samples.
bool controller::follows(std::int64_t parent, std::int64_t child) {
  try {
    if (store_->claim_child(parent, child)) return true;
  } catch (const dra::error&) {
    return true;  // the store's trouble shows in the rebuild
  }
  std::printf(
      "[dra] process %d steps out: another world already followed world epoch %lld (the survivors were "
      "split by store values another client wrote over); %s\n",
      uid_, static_cast<long long>(parent), what_leaving_does(options_.release));
  std::fflush(stdout);
  leave(options_.release == release_mode::exit);
  return false;
}

void controller::note_step_taken_over(std::int64_t attempted, const std::string& reason) {
  // The reduction finished on other members and failed here (a time-out on its last receive):
  // they applied the step, whose sum held this process's gradient, and the recovery handed their
  // state over. The world committed this process's batch with it.
  batch_ = {};
  status_.committed = true;
  status_.step = attempted;
  status_.loss = world_loss_;
  std::fprintf(stderr,
               "[dra] process %d: step %lld's reduction failed here (%s) after it had finished on other members, "
               "which applied it; the world committed that step and this process took its state (the step is not "
               "redone)\n",
               uid_, static_cast<long long>(attempted), reason.c_str());
}

void controller::recover(std::string reason) {
  // The event reports the change against the world that was running when the failure hit, even
  // when a member dies again during the recovery and it takes several attempts.
  const std::vector<int> running = running_members_;
  const std::string first_reason = reason;
  std::vector<int> gone;  // over every attempt: a retried recovery still names the first victims
  for (int attempt = 0; attempt <= options_.max_resize_retries; ++attempt) {
    const auto t0 = clock_type::now();
    // Stop in-flight work: Gloo closes its connections (peers still blocked on it fail at once);
    // NCCL >= 2.28 revokes, which keeps the communicator shrinkable for the abortive shrink.
    if (comm_) comm_->revoke();
    if (deferred_) {
      // The handoff's deferred part dies with the communicator: a joiner that did not get it holds
      // no state (the recovery's leader hands it over again).
      const bool lost = deferred_->receiver() && !deferred_->wait().empty();
      if (lost) holds_state_ = false;
      deferred_.reset();
    }
    // No recovery goes through a dead store: say so with the failure that called for one (the
    // store's own message names only the key it could not read).
    if (store_->gone())
      throw dra::membership_error(
          "dra: process " + std::to_string(uid_) + " cannot recover from '" + first_reason + "': the store at " +
          store_->address() +
          " is gone and every world change goes through it; restart the job from its last "
          "checkpoint, with the store outside any process that may die (e.g. torchrun's agent)");
    refuse_to_train_past_the_loops_end(first_reason);
    // Survivors converge on the latest world that was decided: a member that failed before it
    // learnt of a decision follows it into the decided world (whose joiners may be waiting in it).
    const auto decided = store_->latest_decided_world(epoch_, members_);
    if (!contains(decided.members, uid_)) {
      leave(options_.release == release_mode::exit);  // a decision released it: it was leaving anyway
      return;
    }
    const auto& world = decided.members;
    const auto agreed =
        store_->agree_on_survivors(decided.epoch, world, uid_, holds_state_, step_index_,
                                   options_.fault_timeout_ms() + std::chrono::seconds(1), decided.joiners);
    if (agreed.members.empty()) {
      // Members of the world that hold the state are alive elsewhere (agree_on_survivors): this
      // process followed a decision another client wrote, and the world trains on without it.
      std::printf(
          "[dra] process %d steps out: it holds no state and %zu member(s) of world epoch %lld are alive "
          "elsewhere (a decision another client wrote over led it here); %s\n",
          uid_, agreed.elsewhere.size(), static_cast<long long>(decided.epoch), what_leaving_does(options_.release));
      std::fflush(stdout);
      leave(options_.release == release_mode::exit);
      return;
    }
    if (!contains(agreed.members, uid_)) {
      std::printf("[dra] process %d was left out of epoch %lld (arrived late); %s\n", uid_,
                  static_cast<long long>(agreed.epoch), what_leaving_does(options_.release));
      std::fflush(stdout);
      leave(options_.release == release_mode::exit);
      return;
    }
    refuse_to_train_past_the_loops_end(first_reason);  // a second look: the agreement took a fault timeout
    for (int u : world)
      if (!contains(agreed.members, u) && !contains(gone, u)) gone.push_back(u);  // the dead (or unreachable)
    if (!follows(decided.epoch, agreed.epoch)) return;
    world_change c(change_cause::fault, agreed.epoch, agreed.members);
    // Left: members of the running world that are gone. A joiner of an interrupted grow that did
    // not come (dead, or still waiting for an admission another client wrote over) never was a
    // member: the reason names it, and a live one may still be admitted later.
    std::string not_joined;
    for (int u : gone) {
      if (contains(agreed.members, u)) continue;
      if (contains(running, u))
        c.left.push_back(u);
      else
        not_joined += (not_joined.empty() ? "" : ", ") + std::to_string(u);
    }
    for (int u : agreed.members)
      if (!contains(running, u)) c.joined.push_back(u);  // joiners of an interrupted grow, kept
    c.reason = "peer failure: " + first_reason;
    if (!not_joined.empty()) c.reason += "; joiner(s) " + not_joined + " of the interrupted grow did not come";
    c.before = static_cast<int>(running.size());
    // A fault in a shrink's world change: the shrink was decided, and healing must not undo it
    // (it re-admitted the leaver the shrink had released). In an interrupted grow the running
    // world's size stays the target: the joiners never were members.
    c.heal_to = std::min(c.before, static_cast<int>(world.size()));
    c.agree_s = seconds_since(t0);
    try {
      enter_world(c);
      return;
    } catch (const dra::error& e) {
      reason = std::string("rebuild after fault failed: ") + e.what();
      // Out of file descriptors, this process cannot build any world: while it beats, the others
      // would wait for it at every attempt until the whole job gave up. It leaves the job instead
      // (marked gone: the others' next attempt goes on without it), naming the limit.
      if (const auto why = dra::detail::out_of_descriptors()) {
        abandon(*why);
        const std::string what = e.what();  // the backend's own message may name the limit already
        throw dra::comm_error(
            "dra: process " + std::to_string(uid_) + " cannot enter world epoch " + std::to_string(agreed.epoch) +
            " and left the job: " + (what.find(*why) != std::string::npos ? what : *why + " (" + what + ")"));
      }
    }
  }
  throw dra::membership_error("dra: could not re-form the world after " +
                              std::to_string(options_.max_resize_retries + 1) + " attempts: " + reason);
}

void controller::refuse_to_train_past_the_loops_end(const std::string& reason) {
  // A member whose loop ended (finish) left this world for good: the others' loops ended at a
  // step this one went past (a loop-local counter, which starts at 0 on a joiner; a zip with a
  // loader whose length differs between ranks). Recovering would train on alone, and its leader
  // would save over the world's result (seen: exit 0, the final checkpoint overwritten).
  const auto ended = store_->loop_ended(epoch_);
  if (!ended) return;
  throw dra::membership_error(
      "dra: process " + std::to_string(uid_) + " went on training past the end of the loop: process " +
      std::to_string(ended->uid) + " ended its training loop, or its process exited, after step " +
      std::to_string(ended->step) + " of world epoch " + std::to_string(epoch_) +
      " while this process went on to step " + std::to_string(step_index_) + " (" + reason + "); if process " +
      std::to_string(ended->uid) +
      " did not exit mid-training (sys.exit under a plain interpreter, which tells no exit code to dra), every "
      "member must leave the loop at the same step: break on ctl.step_index or the status's world loss, which "
      "every rank sees alike, not on a counter of the loop's own (a joiner's starts at 0 when it is admitted) or a "
      "loader whose length differs between ranks");
}

}  // namespace dra::elastic
