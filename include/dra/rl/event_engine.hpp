#pragma once
// The RL pipeline's event engine: the state of one run and its event loop. Every sequence finishes
// at its own time on its rollout device (rollout.hpp), a training step starts when its batch is
// generated and runs in updates, and the trainers' world changes at their boundaries (`fire`).
// Which change, when, is the caller's: rl_event_sim (events.hpp) drives this loop with a static
// split, the stage-balance policy or the within-step oracle. docs/design/rl.md.
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"
#include "dra/rl/rollout.hpp"
#include "dra/rl/stage_balance.hpp"
#include "dra/rl/workload.hpp"

namespace dra::sim {

/// The event simulator's configuration: the phase simulator's (workload.hpp), its checks
/// included, plus the barrier switch and the within-step oracle's lookahead.
struct rl_event_config : rl_sim_config {
  /// Per-phase barrier: batch k + 1 starts generating only once batch k is generated (and the
  /// step before trained), as in the phase model (pipeline.hpp). false: no barrier.
  bool barrier = false;
  /// Windows the within-step oracle looks ahead when it tries every trainer count (>= 1).
  int oracle_lookahead = 2;

  void validate() const {
    rl_sim_config::validate();
    if (oracle_lookahead < 1 || oracle_lookahead > 4)
      dra::detail::throw_invalid("oracle_lookahead",
                                 "must lie in [1, 4] windows, got " + std::to_string(oracle_lookahead));
    stage_policy().validate();  // with the group size, which the phase simulator's check leaves out
  }
  /// The phase simulator's policy, with the group size the event simulator schedules by.
  policy::stage_balance_config stage_policy() const {
    auto p = rl_sim_config::stage_policy();
    p.group_size = workload.group_size;
    return p;
  }
};

/// One run's state and event loop; the schedules that drive it are rl_event_sim's (events.hpp).
class rl_event_engine {
 public:
  const rl_event_config& config() const noexcept { return config_; }
  const std::vector<std::vector<double>>& batches() const noexcept { return batches_; }

 protected:
  rl_event_engine(const length_distribution& lengths, rl_event_config config)
      : config_((config.validate(), std::move(config))), batches_(draw_batches(lengths, config_.workload)) {}
  // With the lengths given (a leader's view: 0 where a sequence is not finished).
  rl_event_engine(rl_event_config config, std::vector<std::vector<double>> lengths)
      : config_((config.validate(), std::move(config))), batches_(std::move(lengths)) {}

  enum class role { rollout, train, starting };
  struct device {
    role r = role::rollout;
    rollout_device rd;
    int version = 0;       // policy version of the weights it holds
    double ready_s = 0.0;  // starting: when its engine is up
    bool joined = false;   // joined the trainers at the last boundary (its optimizer state is deferred)
  };
  struct batch_state {
    // Sequences not started, dispatched per device when the batch opens (round robin over the
    // devices generating or starting to); a device with none left steals from the longest queue.
    std::vector<std::deque<int>> assigned;
    int queued = 0;
    bool open = false;
    int remaining = 0;
    double opened_s = -1.0, complete_s = -1.0;
    int rollout_at_open = 0;
  };
  struct pending_switch {
    policy::stage_action direction = policy::stage_action::hold;
    int moved = 0;
    double fired_s = 0.0, blocked_until_s = 0.0;
    rl_switch_record record;
  };
  // One run in progress; a value, so the oracle can try a decision on a copy.
  struct state {
    rl_cost_model cost_model;
    policy::rl_pipeline pipeline = policy::rl_pipeline::one_step_off;
    bool barrier = false;
    double now = 0.0;
    std::vector<device> dev;
    std::vector<int> members;  // trainers, the leader first
    std::vector<batch_state> batches;
    std::vector<char> generated;  // per sequence (batch * n + i): finished once
    int published = 0;            // policy versions published (= training steps done)
    int next_step = 0;            // the training step to run next
    bool training = false, publishing = false;
    int update = 0;
    double step_start_s = 0.0, train_event_s = 0.0, train_compute_s = 0.0, train_sync_s = 0.0, train_tokens = 0.0;
    bool window_open = true, window_fired = false;
    double trainers_free_s = 0.0;
    pending_switch sw;
    int completions_since_decision = 0, idle_seen = 0;
    double busy_s = 0.0;
    double last_step_end = 0.0;
    int trained = 0, generated_count = 0, duplicates = 0;
    policy::stage_balance_policy* policy = nullptr;
    rl_run_result result;
    // The lengths its sequences have: the workload's, or those a look-ahead drew (events.hpp).
    const std::vector<std::vector<double>>* lengths = nullptr;
  };
  const std::vector<std::vector<double>>& L(const state& s) const { return s.lengths ? *s.lengths : batches_; }
  double length_of(int id) const {
    return batches_[static_cast<std::size_t>(id / n())][static_cast<std::size_t>(id % n())];
  }
  static double sum(const std::vector<double>& v) {
    double s = 0.0;
    for (double x : v) s += x;
    return s;
  }
  int n() const { return config_.workload.sequences_per_step(); }
  int steps() const { return config_.workload.steps; }
  // Batch b is generated with version required(b): one step stale (one-step-off) or fresh.
  int required(const state& s, int b) const {
    return s.pipeline == policy::rl_pipeline::one_step_off ? std::max(0, b - 1) : b;
  }

  state initial(int rollout, policy::rl_pipeline pipeline, bool barrier, const rl_cost_model& costs) const {
    state s;
    s.cost_model = costs;
    s.pipeline = pipeline;
    s.barrier = barrier && pipeline == policy::rl_pipeline::one_step_off;
    s.dev.resize(static_cast<std::size_t>(config_.devices));
    for (int d = rollout; d < config_.devices; ++d) {
      s.dev[static_cast<std::size_t>(d)].r = role::train;
      s.members.push_back(d);
    }
    s.batches.resize(static_cast<std::size_t>(steps()));
    s.generated.assign(static_cast<std::size_t>(steps()) * static_cast<std::size_t>(n()), 0);
    s.result.roles.push_back({0.0, rollout, config_.devices - rollout, 0});
    open_batches(s);
    return s;
  }

  // ---- the event loop ------------------------------------------------------------------------
  // Runs until every step is trained (or, with `until_step` >= 0, until that step starts).
  template <class Controller>
  void simulate(state& s, const Controller& control, int until_step) const {
    const rl_cost_model& c = s.cost_model;
    std::vector<int> finished;
    if (s.window_open && !s.window_fired) control(s, true);
    refill_all(s);
    try_start(s);
    while (s.next_step < steps() || s.training) {
      if (until_step >= 0 && s.next_step > until_step) return;
      if (until_step >= 0 && s.next_step == until_step && s.training) return;
      // The next event: a device's completion or preemption, an engine coming up, a step's end.
      double when = std::numeric_limits<double>::infinity();
      int pick = -1;  // device index, or -2: the training step
      for (std::size_t d = 0; d < s.dev.size(); ++d) {
        const device& dv = s.dev[d];
        const double e = dv.r == role::starting  ? dv.ready_s
                         : dv.r == role::rollout ? dv.rd.next_event(c)
                                                 : std::numeric_limits<double>::infinity();
        if (e < when) when = e, pick = static_cast<int>(d);
      }
      if (s.training && s.train_event_s <= when) when = s.train_event_s, pick = -2;
      if (pick == -1)
        throw std::logic_error("rl_event_sim: no event left before every step was trained (step " +
                               std::to_string(s.next_step) + " of " + std::to_string(steps()) + ")");
      s.now = std::max(s.now, when);
      bool decide = false;
      if (pick == -2) {
        const bool ends = s.publishing;
        train_event(s, control);
        if (ends) {
          if (until_step >= 0 && s.next_step >= steps()) return;
          control(s, true);
        }
      } else {
        device& dv = s.dev[static_cast<std::size_t>(pick)];
        if (dv.r == role::starting) {
          dv.r = role::rollout;
          dv.rd.clock = s.now;
          if (s.policy) s.policy->observe_engine_start(c.rollout_start_s);
          sample_roles(s);
        } else {
          finished.clear();
          const double before = dv.rd.clock;
          if (s.policy) {
            auto* pol = s.policy;
            dv.rd.advance(c, finished,
                          [pol](int cc, double ctx, double it, double sec) { pol->observe_decode(cc, ctx, it, sec); });
          } else {
            dv.rd.advance(c, finished);
          }
          s.busy_s += dv.rd.clock - before;
          for (int id : finished) decide |= complete(s, id);
        }
      }
      if (decide && s.window_open && !s.window_fired) control(s, false);
      refill_all(s);
      if (s.window_open && !s.window_fired) {
        const int idle_now = idle_count(s);
        if (idle_now != s.idle_seen) {
          s.idle_seen = idle_now;
          if (idle_now > 0) control(s, false);
        }
      }
      try_start(s);
      check_roles(s);
    }
  }

  // A sequence finished; true when it belongs to the batch the trainers wait for.
  bool complete(state& s, int id) const {
    auto& g = s.generated[static_cast<std::size_t>(id)];
    if (g) ++s.duplicates;
    g = 1;
    ++s.generated_count;
    const int b = id / n();
    const double length = L(s)[static_cast<std::size_t>(b)][static_cast<std::size_t>(id % n())];
    if (s.policy) s.policy->observe_generation(config_.workload.prompt_tokens, length);
    auto& bs = s.batches[static_cast<std::size_t>(b)];
    if (--bs.remaining == 0) {
      bs.complete_s = s.now;
      if (s.policy) s.policy->observe_batch(0.5 * (bs.rollout_at_open + rollout_now(s)), n(), s.now - bs.opened_s);
      open_batches(s);
    }
    if (b != s.next_step) return false;
    const int every = std::max(1, n() / 64);
    return bs.remaining == 0 || ++s.completions_since_decision % every == 0;
  }

  // Opens every batch whose weights are published (and, with the barrier, whose predecessor is
  // generated); its sequences queue in order.
  void open_batches(state& s) const {
    for (int b = 0; b < steps(); ++b) {
      auto& bs = s.batches[static_cast<std::size_t>(b)];
      if (bs.open) continue;
      if (required(s, b) > s.published) break;
      if (s.barrier && b > 0 && s.batches[static_cast<std::size_t>(b - 1)].complete_s < 0.0) break;
      bs.open = true;
      bs.opened_s = s.now;
      bs.rollout_at_open = rollout_now(s);
      bs.remaining = n();
      bs.queued = n();
      bs.assigned.assign(s.dev.size(), {});
      std::vector<int> to;
      for (std::size_t d = 0; d < s.dev.size(); ++d)
        if (s.dev[d].r != role::train) to.push_back(static_cast<int>(d));
      for (int i = 0; i < n(); ++i)
        bs.assigned[static_cast<std::size_t>(to.empty() ? 0 : to[static_cast<std::size_t>(i) % to.size()])].push_back(
            b * n() + i);
    }
  }

  // The lowest open batch with queued sequences that a device holding `version` may generate,
  // or -1.
  int pullable(const state& s, int version) const {
    for (int b = 0; b < steps(); ++b) {
      const auto& bs = s.batches[static_cast<std::size_t>(b)];
      if (!bs.open) break;
      if (bs.queued > 0 && required(s, b) == version) return b;
    }
    return -1;
  }
  // The lowest open batch with queued sequences whose version is newer than `version` (a device
  // reloads for it once it has nothing in flight), or -1.
  int newer(const state& s, int version) const {
    for (int b = 0; b < steps(); ++b) {
      const auto& bs = s.batches[static_cast<std::size_t>(b)];
      if (!bs.open) break;
      if (bs.queued > 0 && required(s, b) > version) return b;
    }
    return -1;
  }

  // Admits the next queued sequence of batch b; its prefill counts as busy time.
  bool admit_next(state& s, device& dv, int b) const {
    auto& bs = s.batches[static_cast<std::size_t>(b)];
    auto* q = &bs.assigned[static_cast<std::size_t>(&dv - s.dev.data())];
    if (q->empty())
      for (auto& other : bs.assigned)
        if (other.size() > q->size()) q = &other;
    const int id = q->front();
    const rollout_item it{id, L(s)[static_cast<std::size_t>(id / n())][static_cast<std::size_t>(id % n())],
                          config_.workload.prompt_tokens, 0.0, config_.workload.max_generation_tokens};
    const double before = dv.rd.clock;
    if (!dv.rd.admit(it, s.cost_model)) return false;
    s.busy_s += dv.rd.clock - before;
    if (s.policy) s.policy->observe_prefill(it.prompt + it.generated, dv.rd.clock - before);
    q->pop_front();
    --bs.queued;
    return true;
  }
  // The batch a rollout device generates next: preempted sequences first (-2), then the lowest
  // batch of its version; once it has nothing in flight, it loads the version a newer batch
  // needs. -1: nothing to do.
  int next_batch(state& s, device& dv) const {
    if (dv.rd.empty()) dv.rd.clock = std::max(dv.rd.clock, s.now);
    const double before = dv.rd.clock;
    dv.rd.admit_waiting(s.cost_model);
    s.busy_s += dv.rd.clock - before;
    if (dv.rd.has_waiting()) return -2;
    int b = pullable(s, dv.version);
    if (b < 0 && dv.rd.empty()) {
      b = newer(s, dv.version);
      if (b >= 0) {  // load the version that batch needs (the staging keeps the recent ones)
        dv.version = required(s, b);
        dv.rd.clock += s.cost_model.weight_load_s;
      }
    }
    return b;
  }
  void refill(state& s, device& dv) const {
    if (dv.r != role::rollout) return;
    for (int b = next_batch(s, dv); b >= 0 && admit_next(s, dv, b);)
      if (s.batches[static_cast<std::size_t>(b)].queued == 0) b = pullable(s, dv.version);
  }
  // Idle rollout devices take work one sequence at a time in turn (the router's least-loaded
  // dispatch), then each fills up.
  void refill_all(state& s) const {
    for (bool any = true; any;) {
      any = false;
      for (auto& dv : s.dev) {
        if (dv.r != role::rollout || dv.rd.concurrency() > 0) continue;
        const int b = next_batch(s, dv);
        if (b >= 0 && admit_next(s, dv, b)) any = true;
      }
    }
    for (auto& dv : s.dev) refill(s, dv);
  }
  bool idle(const state& s, const device& dv) const {
    return dv.r == role::rollout && dv.rd.empty() && pullable(s, dv.version) < 0 && newer(s, dv.version) < 0;
  }
  int idle_count(const state& s) const {
    int k = 0;
    for (const auto& dv : s.dev) k += idle(s, dv);
    return k;
  }

  // ---- training ------------------------------------------------------------------------------
  // A step is `updates_per_step` updates (optimizer steps); the world may change at the boundary
  // before each: the step's window (any time while the trainers wait for its batch, at the latest
  // when it starts) and between two updates.
  void try_start(state& s) const {
    if (s.training || s.next_step >= steps() || s.members.empty()) return;
    const auto& bs = s.batches[static_cast<std::size_t>(s.next_step)];
    if (!bs.open || bs.remaining > 0) return;
    if (!s.window_fired) fire(s, 0, {});  // the boundary happens at the latest now
    const auto& batch = L(s)[static_cast<std::size_t>(s.next_step)];
    s.train_tokens = sum(batch) + config_.workload.prompt_tokens * static_cast<double>(batch.size());
    s.training = true;
    s.publishing = false;
    s.update = 0;
    s.window_open = false;
    s.step_start_s = std::max(s.now, s.trainers_free_s);
    start_update(s);
  }

  void start_update(state& s) const {
    const rl_cost_model& c = s.cost_model;
    const int t = static_cast<int>(s.members.size());
    const double tokens = s.train_tokens / config_.workload.updates_per_step;
    s.train_compute_s = c.train_fixed_s + c.train_per_token_s * tokens / t;
    s.train_sync_s = c.sync_s(t);
    double optimizer = 0.0;  // deferred restore: a joiner's optimizer state streams during its first compute
    for (int m : s.members)
      if (s.dev[static_cast<std::size_t>(m)].joined)
        optimizer = std::max(optimizer, c.switch_optimizer_s - s.train_compute_s);
    const double start = std::max(s.now, s.trainers_free_s);
    s.train_event_s = start + s.train_compute_s + s.train_sync_s + optimizer;
    s.busy_s += t * (s.train_compute_s + s.train_sync_s);
    if (s.sw.direction != policy::stage_action::hold) {  // the switch's exposed part: what it delayed
      auto& rec = s.sw.record;
      const double ready = s.update == 0
                               ? std::max(s.batches[static_cast<std::size_t>(s.next_step)].complete_s, s.sw.fired_s)
                               : s.sw.fired_s;
      rec.exposed_s = std::min(rec.total_s, std::max(0.0, start - ready) + optimizer);
      rec.hidden_s = rec.total_s - rec.exposed_s;
      rec.phase = s.next_step;
      if (s.policy) s.policy->observe_switch(s.sw.direction, rec.exposed_s);
      s.result.switch_log.push_back(rec);
      s.sw = {};
    }
    for (int m : s.members) s.dev[static_cast<std::size_t>(m)].joined = false;
  }

  // An update ended (or, after the last, the publication of the step's weights).
  template <class Controller>
  void train_event(state& s, const Controller& control) const {
    const rl_cost_model& c = s.cost_model;
    if (s.publishing) return end_step(s);
    const int t = static_cast<int>(s.members.size());
    if (s.policy) {
      s.policy->observe_train(t, s.train_tokens / config_.workload.updates_per_step / t,
                              s.train_compute_s + s.train_sync_s, s.train_sync_s);
    }
    s.trainers_free_s = s.now;
    if (++s.update < config_.workload.updates_per_step) {
      s.window_fired = false;  // the boundary between two updates: one decision, now
      control(s, true);
      if (!s.window_fired) fire(s, 0, {});
      start_update(s);
      return;
    }
    s.publishing = true;
    s.train_event_s = s.now + c.weight_sync_s;
  }

  void end_step(state& s) const {
    const rl_cost_model& c = s.cost_model;
    const int k = s.next_step;
    const int t = static_cast<int>(s.members.size());
    s.training = false;
    s.publishing = false;
    ++s.next_step;
    s.published = s.next_step;
    s.trained += n();
    s.trainers_free_s = s.now;
    for (int m : s.members) s.dev[static_cast<std::size_t>(m)].version = s.published;
    if (s.policy) s.policy->observe_weight_sync(c.weight_sync_s);
    const auto& bs = s.batches[static_cast<std::size_t>(k)];
    const auto& batch = batches_[static_cast<std::size_t>(k)];
    rl_phase_record rec;
    rec.phase = k;
    rec.train = t;
    rec.rollout = config_.devices - t;
    rec.start_s = s.last_step_end;
    rec.duration_s = s.now - s.last_step_end;
    rec.rollout_s = bs.complete_s - bs.opened_s;
    rec.train_s = s.now - s.step_start_s;
    rec.mean_length = sum(batch) / static_cast<double>(batch.size());
    rec.longest = *std::max_element(batch.begin(), batch.end());
    rec.trained_sequences = n();
    rec.predicted_s =
        std::max(0.0, s.step_start_s - std::max(bs.complete_s, s.last_step_end));  // the step's start delay
    for (const auto& w : s.result.switch_log)
      if (w.phase == k) {
        rec.switch_total_s += w.total_s;
        rec.switch_exposed_s += w.exposed_s;
        rec.action = w.direction;
      }
    s.result.phases.push_back(rec);
    s.last_step_end = s.now;
    s.window_open = s.next_step < steps();
    s.window_fired = false;
    s.completions_since_decision = 0;
    s.idle_seen = 0;
    open_batches(s);
  }

  // The boundary: leavers (the newest trainers) go to rollout, joiners (idle rollout devices) come
  // in. Once per window; its blocking part (agreement, rebuild, weights a joiner lacks) delays the
  // step, the optimizer state of joiners streams during their first step.
  void fire(state& s, int leave, const std::vector<int>& join) const {
    const rl_cost_model& c = s.cost_model;
    s.window_fired = true;
    if (leave == 0 && join.empty()) return;
    pending_switch sw;
    sw.direction = leave > 0 ? policy::stage_action::to_rollout : policy::stage_action::to_train;
    sw.moved = leave > 0 ? leave : static_cast<int>(join.size());
    sw.fired_s = s.now;
    auto& rec = sw.record;
    rec.direction = policy::to_string(sw.direction);
    rec.moved = sw.moved;
    rec.agree_s = c.switch_agree_s;
    rec.rebuild_s = c.switch_rebuild_s;
    double block = c.switch_agree_s + c.switch_rebuild_s;
    const bool mid = s.training;  // between two updates: the trainers' weights are not a published version
    for (int i = 0; i < leave; ++i) {
      const int d = s.members.back();
      s.members.pop_back();
      device& dv = s.dev[static_cast<std::size_t>(d)];
      dv.r = role::starting;
      dv.version = mid ? -1 : s.published;  // in the window it holds the newest published weights
      dv.ready_s = s.now + c.switch_agree_s + c.rollout_start_s;
      dv.rd.clock = dv.ready_s;
      rec.rollout_start_s = c.rollout_start_s;
    }
    bool weights = false;
    for (int d : join) redistribute(s, d);
    for (int d : join) {
      device& dv = s.dev[static_cast<std::size_t>(d)];
      weights |= mid || dv.version != s.published;
      dv.r = role::train;
      dv.joined = true;
      dv.version = s.published;
      s.members.push_back(d);
      rec.optimizer_s = c.switch_optimizer_s;
    }
    if (weights) block += c.switch_weights_s, rec.weights_s = c.switch_weights_s;
    s.trainers_free_s = std::max(s.trainers_free_s, s.now + block);
    rec.total_s = rec.agree_s + rec.rebuild_s + rec.weights_s + rec.optimizer_s + rec.rollout_start_s;
    s.sw = std::move(sw);
    sample_roles(s);
  }

  // A device joining the trainers hands its dispatched sequences to the others, in turn.
  void redistribute(state& s, int from) const {
    std::vector<int> to;
    for (std::size_t d = 0; d < s.dev.size(); ++d)
      if (s.dev[d].r != role::train && static_cast<int>(d) != from) to.push_back(static_cast<int>(d));
    if (to.empty()) return;
    for (auto& bs : s.batches) {
      if (!bs.open || bs.assigned.empty()) continue;
      auto& mine = bs.assigned[static_cast<std::size_t>(from)];
      for (std::size_t i = 0; !mine.empty(); ++i, mine.pop_front())
        bs.assigned[static_cast<std::size_t>(to[i % to.size()])].push_back(mine.front());
    }
  }

  int rollout_now(const state& s) const {
    int r = 0;
    for (const auto& dv : s.dev) r += dv.r != role::train;
    return r;
  }

  // ---- what a decision reads ---------------------------------------------------------------
  std::vector<int> idle_devices(const state& s) const {
    std::vector<int> out;
    for (std::size_t d = 0; d < s.dev.size(); ++d)
      if (idle(s, s.dev[d])) out.push_back(static_cast<int>(d));
    return out;
  }
  void flight(const state& s, int batch, std::vector<double>& out) const {
    out.clear();
    for (const auto& dv : s.dev) {
      if (dv.r != role::rollout) continue;
      dv.rd.for_each_active([&](int id, double generated) {
        if (id / n() == batch) out.push_back(generated);
      });
    }
  }

  // ---- bookkeeping ---------------------------------------------------------------------------
  void sample_roles(state& s) const {
    rl_role_sample r{s.now, 0, 0, 0};
    for (const auto& dv : s.dev) {
      if (dv.r == role::rollout) ++r.rollout;
      if (dv.r == role::train) ++r.train;
      if (dv.r == role::starting) ++r.moving;
    }
    s.result.roles.push_back(r);
  }
  // No device in two roles; the trainers are exactly the members.
  void check_roles(const state& s) const {
    int trainers = 0;
    for (const auto& dv : s.dev) trainers += dv.r == role::train;
    if (trainers != static_cast<int>(s.members.size()) || s.members.empty())
      throw std::logic_error("rl_event_sim: " + std::to_string(trainers) + " devices in the trainer role but " +
                             std::to_string(s.members.size()) + " world members");
    std::vector<char> seen(s.dev.size(), 0);
    for (int m : s.members) {
      if (seen[static_cast<std::size_t>(m)]++)
        throw std::logic_error("rl_event_sim: a device is twice in the trainers' world");
    }
  }

  rl_event_config config_;
  std::vector<std::vector<double>> batches_;
};

}  // namespace dra::sim
