#include "leader.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "dra/policy/constraints.hpp"

namespace dra::elastic::detail {

using clock_type = std::chrono::steady_clock;

std::optional<published_decision> leader::decide(const world_view& view) {
  decided_ = false;
  const auto t0 = clock_type::now();
  const int current = static_cast<int>(view.members.size());
  if (const auto it = options_.resize_schedule.find(view.step); it != options_.resize_schedule.end())
    scheduled_ = scheduled_size{it->second, view.step, t0};
  if (scheduled_ && scheduled_->size == current) scheduled_.reset();
  const bool scheduled = scheduled_.has_value();
  try {
    // The candidates and the pool's limit are store round trips (~1 ms on a loaded host): read
    // at most every capacity_poll_s (1 s), so that a step that decides nothing costs no store
    // access; at every step for the first two seconds of a scheduled size still waiting for its
    // processes.
    look_outside(view, scheduled && t0 - scheduled_->since < std::chrono::seconds(2));
    const int cands = static_cast<int>(candidates_.size());
    // Members the outside actor names in `leave` go now (their devices are taken back), and the
    // world above max_size shrinks to it. The leader (members[0]) never leaves.
    int named = 0;
    if (limit_)
      for (std::size_t r = 1; r < view.members.size(); ++r)
        named += std::count(limit_->leave.begin(), limit_->leave.end(), view.members[r]) > 0 ? 1 : 0;
    int most = current - named;
    if (limit_ && limit_->max_size > 0) most = std::min(most, limit_->max_size);
    const bool above = limit_ && most < current;
    const bool below = limit_ && limit_->min_size > current && cands > 0;
    // Healing: waiting processes other than flapping ones, up to the size before the fault(s).
    std::vector<int> healers;
    int heal_to = 0;
    const auto plan_heal = [&] {
      healers.clear();
      if (!options_.heal || view.heal_size <= current) return;
      for (int uid : candidates_)
        if (std::find(view.flapping.begin(), view.flapping.end(), uid) == view.flapping.end()) healers.push_back(uid);
      heal_to = std::min(view.heal_size, current + static_cast<int>(healers.size()));
      if (limit_ && limit_->max_size > 0) heal_to = std::min(heal_to, limit_->max_size);
      const auto& own = engine_.config().limits;
      heal_to = std::min(heal_to, own.max_size);
      if (!own.allowed_sizes.empty()) {  // the largest size the job allows on the way back
        int allowed = 0;
        for (int s : own.allowed_sizes)
          if (s <= heal_to && s > allowed) allowed = s;
        heal_to = allowed;
      }
    };
    plan_heal();
    const bool heal = !above && !healers.empty() && heal_to > current;
    if (!above && !below && !scheduled && !heal && !engine_.decision_due(view.step)) return std::nullopt;
    auto& w = engine_.world();
    w.size = current;
    w.active = view.members;
    w.candidates = candidates_;
    w.global_batch = static_cast<double>(view.global_batch);
    int available = current + cands;
    if (limit_ && limit_->max_size > 0) available = std::min(available, limit_->max_size);
    engine_.capacity().available = available;
    policy::decision d;
    if (above) {
      d = policy::plan_resize(w, std::max(most, 1), 1.0, 1.0,
                              "limit: the job may use " + std::to_string(std::max(most, 1)), limit_->leave);
    } else if (below) {
      const int target = std::min(limit_->min_size, current + cands);
      d = policy::plan_resize(w, target, 1.0, 1.0, "limit: the job is granted " + std::to_string(limit_->min_size));
    } else if (scheduled) {
      const int target = scheduled_->size;
      d = policy::plan_resize(
          w, target, 1.0, 1.0,
          "schedule: size " + std::to_string(target) + " at step " + std::to_string(scheduled_->step));
    } else if (heal) {
      look_outside(view, true);  // candidates up to a second old: admit from a fresh list
      plan_heal();
      w.candidates = healers;
      d = policy::plan_resize(w, std::max(heal_to, current), 1.0, 1.0,
                              "heal: back to " + std::to_string(heal_to) + " of the " + std::to_string(view.heal_size) +
                                  " processes the world had before a fault");
      w.candidates = candidates_;
    } else {
      d = engine_.decide();
      if (d.kind == policy::action::grow) {
        // The policy saw candidates up to a second old: admit from a fresh list.
        look_outside(view, true);
        w.candidates = candidates_;
        auto fresh = policy::plan_resize(w, d.target_size, d.batch_scale, d.lr_scale, d.reason);
        fresh.policy = d.policy;
        fresh.predicted_speedup = d.predicted_speedup;
        d = std::move(fresh);
      }
    }
    if (options_.batch != batch_mode::adascale) d.batch_scale = d.lr_scale = 1.0;
    if (d.kind == policy::action::grow && d.join.empty()) d.kind = policy::action::hold;  // nobody to admit yet
    last_ = d;
    decided_ = true;
    if (d.join.empty() && d.leave.empty() && d.batch_scale == 1.0) return std::nullopt;  // hold: costs nothing more
    published_decision p{std::move(d), store_.next_epoch(view.epoch), view.step};
    store_.publish_decision(view.epoch, p);
    if (skipped_since_ >= 0) {
      std::fprintf(stderr, "[dra] decisions taken again from step %lld (skipped since step %lld)\n",
                   static_cast<long long>(view.step), static_cast<long long>(skipped_since_));
      skipped_since_ = -1;
    }
    return p;
  } catch (const dra::error& e) {
    // Once per streak: with the store gone it would say so at every step.
    if (skipped_since_ < 0)
      std::fprintf(stderr, "[dra] decision at step %lld skipped: %s (further skipped decisions are not printed)\n",
                   static_cast<long long>(view.step), e.what());
    if (skipped_since_ < 0) skipped_since_ = view.step;
    return std::nullopt;
  }
}

void leader::look_outside(const world_view& view, bool force) {
  const auto now = clock_type::now();
  if (!force && now - outside_read_ < std::chrono::duration<double>(options_.capacity_poll_s)) return;
  outside_read_ = now;
  candidates_ = store_.admissible_candidates(
      view.members, view.signature, view.layout,
      [&](int uid, const std::string& why) { log_.rejected(view.step, view.epoch, uid, why); });
  limit_ = store_.limit();
  if (limit_ && !limit_->leave.empty()) {
    // A candidate the outside actor names in `leave` is never admitted: it is dismissed, and
    // leaves as a released member would (release="exit": it exits 0, its device goes back).
    const auto& leave = limit_->leave;
    const auto named = [&](int uid) { return std::find(leave.begin(), leave.end(), uid) != leave.end(); };
    for (int uid : candidates_)
      if (named(uid)) store_.dismiss(uid, "named in capacity's leave (its device is being taken back)");
    candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(), named), candidates_.end());
  }
  publish_report(view);
}

nlohmann::json leader::rates_json() const {
  nlohmann::json rates = nlohmann::json::object(), seconds = nlohmann::json::object();
  for (const auto& [size, r] : rates_) {
    rates[std::to_string(size)] = r.samples_per_s;
    seconds[std::to_string(size)] = r.seconds;
  }
  return {{"rates", rates}, {"rate_s", seconds}};
}

void leader::publish_report(const world_view& view) {
  const auto now = clock_type::now();
  const double dt = std::chrono::duration<double>(now - report_time_).count();
  const double rate = report_samples_ > 0 && dt > 0 ? static_cast<double>(view.samples - report_samples_) / dt : 0.0;
  report_time_ = now;
  report_samples_ = view.samples;
  const int size = static_cast<int>(view.members.size());
  if (rate > 0 && size == report_world_) {
    // Samples/s measured at each world size the job ran at (an EMA per size, and for how long):
    // what a pool fits a job's speedup curve to. An interval that spans a world change (the
    // handoff's pause, two sizes) measures neither size.
    auto& r = rates_[size];
    r.samples_per_s = r.samples_per_s > 0 ? 0.7 * r.samples_per_s + 0.3 * rate : rate;
    r.seconds += dt;
  }
  report_world_ = size;
  const auto rates = rates_json();
  const auto& s = engine_.signals();
  const auto& tp = engine_.throughput();
  const double wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  store_.publish_report({
      {"time", wall},
      {"step", view.step},
      {"epoch", view.epoch},
      {"world", view.members.size()},
      {"members", view.members},
      {"candidates", candidates_.size()},
      {"samples_per_s", rate},
      {"global_batch", view.global_batch},
      {"loss", s.smoothed_loss},
      {"phase", signals::to_string(s.phase)},
      {"gns", s.gns_valid ? nlohmann::json(s.gns) : nlohmann::json(nullptr)},
      {"policy", engine_.config().policy},
      {"desired_size", engine_.desired_size()},
      {"rates", rates.at("rates")},
      {"rate_s", rates.at("rate_s")},
      {"throughput",
       {{"compute_fixed_s", tp.compute_time_s(0.0)},
        {"compute_per_sample_s", tp.compute_time_s(1.0) - tp.compute_time_s(0.0)},
        {"sync_fixed_s", tp.sync_time_s(2)},
        {"sync_per_rank_s", tp.sync_time_s(3) - tp.sync_time_s(2)},
        {"observations", tp.observations()}}},
  });
}

}  // namespace dra::elastic::detail
