#pragma once
// The rollout stage of the RL pipeline simulator: continuous batching on each rollout device,
// simulated exactly, event by event (see pipeline.hpp for the model).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/rl/workload.hpp"

namespace dra::sim {

/// Observer of decode segments (concurrency, mean context tokens, iterations, seconds).
using decode_sink = std::function<void(int, double, double, double)>;

struct rollout_outcome {
  double makespan_s = 0.0;
  double busy_device_s = 0.0;  ///< sum over devices of decode time
};

/// Exact continuous-batching simulation of one batch on `devices` rollout devices sharing one
/// queue. `start_s[d]`: when device d can start (empty: all at 0).
inline rollout_outcome simulate_rollout(const std::vector<double>& lengths, int devices, double prompt_tokens,
                                        const rl_cost_model& c, const std::vector<double>& start_s = {},
                                        const decode_sink& sink = nullptr) {
  if (devices < 1) dra::detail::throw_invalid("devices", "a rollout needs >= 1 device, got " + std::to_string(devices));
  struct seq {
    double finish;  // device iteration count at which it completes
    double start;   // device iteration count at which it was admitted
    bool operator>(const seq& o) const { return finish > o.finish; }
  };
  struct device {
    double t = 0.0, begin = 0.0, iteration = 0.0, start_sum = 0.0;
    std::vector<seq> active;  // min-heap on finish
    bool started = false, done = false;
  };
  std::vector<device> dev(static_cast<std::size_t>(devices));
  for (std::size_t d = 0; d < dev.size(); ++d) dev[d].t = dev[d].begin = d < start_s.size() ? start_s[d] : 0.0;
  std::size_t next = 0;
  const auto slots = static_cast<std::size_t>(c.max_concurrency);
  const auto admit = [&](device& d) {
    while (d.active.size() < slots && next < lengths.size()) {
      d.active.push_back({d.iteration + std::max(1.0, std::round(lengths[next++])), d.iteration});
      std::push_heap(d.active.begin(), d.active.end(), std::greater<>());
      d.start_sum += d.iteration;
    }
  };
  // Time at which the device's next completion happens (inf when idle for good).
  const auto next_event = [&](const device& d) {
    if (!d.started) return d.t;
    if (d.active.empty()) return std::numeric_limits<double>::infinity();
    const double m = d.active.front().finish - d.iteration;
    const double cc = static_cast<double>(d.active.size());
    const double s0 = cc * prompt_tokens + cc * d.iteration - d.start_sum;
    return d.t + m * (c.decode_fixed_s + c.decode_per_sequence_s * cc + c.decode_per_kilotoken_s * s0 / 1000.0) +
           c.decode_per_kilotoken_s * cc * m * (m - 1.0) / 2.0 / 1000.0;
  };
  // A router spreads the batch over the devices that are up at the start (round robin, at most
  // `slots` each: least-loaded dispatch); what does not fit waits in the shared queue and is
  // pulled as slots free. A device that starts later pulls from that queue when it comes up.
  std::vector<std::size_t> up;
  for (std::size_t d = 0; d < dev.size(); ++d)
    if (dev[d].t <= 0.0) up.push_back(d), dev[d].started = true;
  for (bool any = true; any && next < lengths.size();) {
    any = false;
    for (std::size_t d : up) {
      device& dv = dev[d];
      if (dv.active.size() >= slots || next >= lengths.size()) continue;
      dv.active.push_back({std::max(1.0, std::round(lengths[next++])), 0.0});
      std::push_heap(dv.active.begin(), dv.active.end(), std::greater<>());
      any = true;
    }
  }
  rollout_outcome out;
  for (;;) {
    std::size_t pick = dev.size();
    double when = std::numeric_limits<double>::infinity();
    for (std::size_t d = 0; d < dev.size(); ++d) {
      const double e = next_event(dev[d]);
      if (e < when) when = e, pick = d;
    }
    if (pick == dev.size()) break;
    device& d = dev[pick];
    if (!d.started) {
      d.started = true;
      admit(d);
      continue;
    }
    const double m = d.active.front().finish - d.iteration;
    const int cc = static_cast<int>(d.active.size());
    const double s0 = cc * prompt_tokens + cc * d.iteration - d.start_sum;
    if (sink) sink(cc, s0 + cc * (m - 1.0) / 2.0, m, when - d.t);
    d.t = when;
    d.iteration += m;
    while (!d.active.empty() && d.active.front().finish <= d.iteration) {
      std::pop_heap(d.active.begin(), d.active.end(), std::greater<>());
      d.start_sum -= d.active.back().start;
      d.active.pop_back();
    }
    admit(d);
  }
  for (const auto& d : dev) {
    const double busy = d.started ? d.t - d.begin : 0.0;
    out.busy_device_s += busy;
    out.makespan_s = std::max(out.makespan_s, d.started && d.t > d.begin ? d.t : 0.0);
  }
  return out;
}

}  // namespace dra::sim
