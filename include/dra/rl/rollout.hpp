#pragma once
// The rollout stage of the RL simulators: continuous batching on one rollout device, simulated
// exactly, event by event, with the KV cache as a limit (docs/design/rl.md, "Rollout").
#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/rl/workload.hpp"

namespace dra::sim {

/// Observer of decode segments (concurrency, total context tokens on average, iterations, seconds).
using decode_sink = std::function<void(int, double, double, double)>;

/// A sequence handed to a rollout device: its id (the caller's), the tokens it will generate in
/// all, its prompt, and what it generated before (nonzero after a preemption).
struct rollout_item {
  int id = 0;
  double length = 1.0;
  double prompt = 0.0;
  double generated = 0.0;
  double limit = 0.0;  ///< the generation limit the scheduler knows (its KV reservation)
};

/// One rollout device: at most `max_concurrency` sequences decode at once, one token each per
/// iteration of cost a + b c + k S / 1000 (c active, S their context tokens). Between two events
/// the cost is an arithmetic series, summed in closed form. With a KV budget, the device admits
/// while the context fits under its admission limit and, when the growing contexts overflow the
/// budget, preempts its newest sequence into its own waiting list (vLLM's recompute preemption:
/// re-admitted later with a prefill of everything it holds).
class rollout_device {
 public:
  double clock = 0.0;  ///< when the device is next free to decode (after prefills, loads)

  int concurrency() const noexcept { return static_cast<int>(active_.size()); }
  bool empty() const noexcept { return active_.empty() && waiting_.empty(); }
  bool has_waiting() const noexcept { return !waiting_.empty(); }
  double context_tokens() const noexcept { return base_ + concurrency() * iteration_; }
  /// Tokens generated so far by each active sequence, with its id.
  template <class F>
  void for_each_active(F f) const {
    for (const auto& a : active_) f(a.id, a.generated + (iteration_ - a.start));
  }

  /// Admits `s` if a decode slot is free and its context fits; pays its prefill. False: no room.
  bool admit(const rollout_item& s, const rl_cost_model& c) {
    const double ctx = s.prompt + s.generated;
    const double reserve = c.kv_reserve_ratio * std::max(0.0, s.limit - s.generated);
    // Room for its context, and for one more token of every sequence (no preemption right away).
    if (concurrency() >= c.max_concurrency || context_tokens() + reserved(c) + ctx + reserve > c.kv_admit_limit() ||
        context_tokens() + ctx + concurrency() + 1 > c.kv_capacity_or_inf())
      return false;
    const double remaining = std::max(1.0, std::round(s.length - s.generated));
    active_.push_back({iteration_ + remaining, iteration_, s.id, s.prompt, s.generated, s.length, s.limit});
    std::push_heap(active_.begin(), active_.end(), later);
    base_ += ctx - iteration_;
    prompts_ += s.prompt;
    limits_ += s.limit;
    clock += c.prefill_per_kilotoken_s * ctx / 1000.0;
    return true;
  }
  /// Gives every sequence held here (active or preempted) the length f(id, generated so far)
  /// (at least one token more): a look-ahead on drawn lengths (events.hpp).
  template <class F>
  void resample(F f) {
    for (auto& a : active_) {
      const double g = a.generated + (iteration_ - a.start);
      a.length = std::max(g + 1.0, f(a.id, g));
      a.finish = a.start + std::max(1.0, std::round(a.length - a.generated));
    }
    std::make_heap(active_.begin(), active_.end(), later);
    for (auto& w : waiting_) w.length = std::max(w.generated + 1.0, f(w.id, w.generated));
  }
  /// Sequences preempted here, with what each generated, front (re-admitted first) to back.
  template <class F>
  void for_each_waiting(F f) const {
    for (const auto& w : waiting_) f(w.id, w.generated);
  }
  /// Puts back a sequence that was decoding here (a leader's snapshot, snapshot.hpp): no
  /// admission check, no prefill. `s.generated` is what it had generated when it was admitted,
  /// `decoded` the tokens it generated here since. Sequences resumed in order with increasing
  /// remaining tokens (length - generated) keep that order.
  void resume(const rollout_item& s, double decoded) {
    const double start = iteration_ - decoded;
    active_.push_back({start + std::max(1.0, std::round(s.length - s.generated)), start, s.id, s.prompt, s.generated,
                       s.length, s.limit});
    std::push_heap(active_.begin(), active_.end(), later);
    base_ += s.prompt + s.generated - start;
    prompts_ += s.prompt;
    limits_ += s.limit;
  }
  /// What each active sequence had generated when it was admitted here, with its id.
  template <class F>
  void for_each_admitted(F f) const {
    for (const auto& a : active_) f(a.id, a.generated);
  }
  /// Puts back a preempted sequence, at the back of the waiting list.
  void resume_waiting(const rollout_item& s) { waiting_.push_back(s); }
  /// Re-admits preempted sequences first (front first); true when any was admitted.
  bool admit_waiting(const rl_cost_model& c) {
    bool any = false;
    while (!waiting_.empty() && admit(waiting_.front(), c)) waiting_.pop_front(), any = true;
    return any;
  }

  /// When the next completion or forced preemption happens (inf: nothing to decode).
  double next_event(const rl_cost_model& c) const {
    if (active_.empty()) return std::numeric_limits<double>::infinity();
    const double m = segment(c);
    return clock + segment_s(c, m);
  }

  /// Decodes up to the next event: completed sequences go to `finished` (their ids), a preempted
  /// one to this device's waiting list.
  void advance(const rl_cost_model& c, std::vector<int>& finished, const decode_sink& sink = nullptr) {
    if (active_.empty()) return;
    const double m = segment(c);
    if (m > 0.0) {
      const double s = segment_s(c, m);
      if (sink) sink(concurrency(), context_tokens() + concurrency() * (m - 1.0) / 2.0, m, s);
      clock += s;
      iteration_ += m;
    }
    while (!active_.empty() && active_.front().finish <= iteration_) {
      std::pop_heap(active_.begin(), active_.end(), later);
      const entry e = active_.back();
      active_.pop_back();
      base_ -= e.prompt + e.generated - e.start;
      prompts_ -= e.prompt;
      limits_ -= e.limit;
      finished.push_back(e.id);
    }
    // The next token of every active sequence must fit: preempt the newest until it does.
    while (!active_.empty() && context_tokens() + concurrency() > c.kv_capacity_or_inf()) preempt_newest();
  }

 private:
  struct entry {
    double finish, start;  // device iterations: completion, admission
    int id;
    double prompt, generated, length, limit;  // generated: before admission
  };
  // KV the scheduler keeps for the active sequences' growth: the ratio of what they may still
  // generate (their limits minus what they generated).
  double reserved(const rl_cost_model& c) const {
    if (!(c.kv_reserve_ratio > 0.0)) return 0.0;
    return c.kv_reserve_ratio * std::max(0.0, limits_ - (context_tokens() - prompts_));
  }
  static bool later(const entry& a, const entry& b) {
    return a.finish > b.finish || (a.finish == b.finish && a.id > b.id);
  }

  // Iterations to the next event: the next completion, or the last iteration whose tokens fit.
  double segment(const rl_cost_model& c) const {
    const double m = active_.front().finish - iteration_;
    const double cap = c.kv_capacity_or_inf();
    if (!std::isfinite(cap)) return m;
    const double fit = std::floor((cap - context_tokens()) / concurrency());
    return std::clamp(fit, 0.0, m);
  }
  double segment_s(const rl_cost_model& c, double m) const {
    const double cc = concurrency();
    return m * (c.decode_fixed_s + c.decode_per_sequence_s * cc +
                c.decode_per_kilotoken_s * context_tokens() / 1000.0) +
           c.decode_per_kilotoken_s * cc * m * (m - 1.0) / 2.0 / 1000.0;
  }
  void preempt_newest() {
    auto it = std::max_element(active_.begin(), active_.end(), [](const entry& a, const entry& b) {
      return a.start < b.start || (a.start == b.start && a.id < b.id);
    });
    const entry e = *it;
    active_.erase(it);
    std::make_heap(active_.begin(), active_.end(), later);
    base_ -= e.prompt + e.generated - e.start;
    prompts_ -= e.prompt;
    limits_ -= e.limit;
    waiting_.push_front({e.id, e.length, e.prompt, e.generated + (iteration_ - e.start), e.limit});
  }

  double iteration_ = 0.0;
  double base_ = 0.0;  // sum over active of (prompt + generated before admission - admission iteration)
  double prompts_ = 0.0, limits_ = 0.0;  // sums over active of prompt tokens and generation limits
  std::vector<entry> active_;
  std::deque<rollout_item> waiting_;
};

struct rollout_outcome {
  double makespan_s = 0.0;
  double busy_device_s = 0.0;  ///< sum over devices of decode time
  double ninety_s = 0.0;       ///< when 90 % of the sequences had finished (the rest: the tail)
};

/// One batch on `devices` rollout devices sharing one queue, pulled in order as slots free.
/// `start_s[d]`: when device d can start (empty: all at 0). `prompt_tokens` is every sequence's;
/// `limit` the generation limit the scheduler reserves KV for (with kv_reserve_ratio).
inline rollout_outcome simulate_rollout(const std::vector<double>& lengths, int devices, double prompt_tokens,
                                        const rl_cost_model& c, const std::vector<double>& start_s = {},
                                        const decode_sink& sink = nullptr, double limit = 0.0) {
  if (devices < 1) dra::detail::throw_invalid("devices", "a rollout needs >= 1 device, got " + std::to_string(devices));
  std::vector<rollout_device> dev(static_cast<std::size_t>(devices));
  std::vector<double> begin(dev.size());
  std::vector<char> started(dev.size(), 0);
  for (std::size_t d = 0; d < dev.size(); ++d) dev[d].clock = begin[d] = d < start_s.size() ? start_s[d] : 0.0;
  std::size_t next = 0;
  const auto item = [&](std::size_t i) {
    return rollout_item{static_cast<int>(i), lengths[i], prompt_tokens, 0.0, limit};
  };
  const auto pull = [&](rollout_device& d) {
    d.admit_waiting(c);
    while (next < lengths.size() && !d.has_waiting() && d.admit(item(next), c)) ++next;
  };
  // A router spreads the batch over the devices that are up at the start (round robin while they
  // have room: least-loaded dispatch); the rest waits in the shared queue. A device that starts
  // later pulls from that queue when it comes up.
  std::vector<std::size_t> up;
  for (std::size_t d = 0; d < dev.size(); ++d)
    if (dev[d].clock <= 0.0) up.push_back(d), started[d] = 1;
  for (bool any = true; any && next < lengths.size();) {
    any = false;
    for (std::size_t d : up)
      if (next < lengths.size() && dev[d].admit(item(next), c)) ++next, any = true;
  }
  std::vector<int> finished;
  rollout_outcome out;
  std::size_t done = 0;
  for (;;) {
    std::size_t pick = dev.size();
    double when = std::numeric_limits<double>::infinity();
    for (std::size_t d = 0; d < dev.size(); ++d) {
      const double e = started[d] ? dev[d].next_event(c) : dev[d].clock;
      if (e < when) when = e, pick = d;
    }
    if (pick == dev.size()) break;
    rollout_device& d = dev[pick];
    if (!started[pick]) {
      started[pick] = 1;
      pull(d);
      continue;
    }
    finished.clear();
    d.advance(c, finished, sink);
    done += finished.size();
    if (out.ninety_s == 0.0 && done * 10 >= lengths.size() * 9) out.ninety_s = d.clock;
    pull(d);
  }
  for (std::size_t d = 0; d < dev.size(); ++d) {
    if (!started[d]) continue;
    out.busy_device_s += dev[d].clock - begin[d];
    if (dev[d].clock > begin[d]) out.makespan_s = std::max(out.makespan_s, dev[d].clock);
  }
  return out;
}

}  // namespace dra::sim
