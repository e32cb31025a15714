#pragma once
// Where a job's devices are: the free devices of each node and the placement rules (packed,
// Tiresias's most-free-node-first, Pollux's at most one distributed job per node).
#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dra/sim/job_model.hpp"

namespace dra::sim::detail {

/// Where each job of a decision would run: devices per node (empty: none), devices, and whether it
/// moves at an unchanged count (Pollux charges any change of a job's node-level allocation).
struct placement_plan {
  explicit placement_plan(std::size_t jobs) : alloc(jobs), got(jobs, 0), moved(jobs, false) {}
  std::vector<std::vector<int>> alloc;
  std::vector<int> got;
  std::vector<bool> moved;
  void set(std::size_t i, std::vector<int> a) {
    got[i] = 0;
    for (int c : a) got[i] += c;
    alloc[i] = got[i] > 0 ? std::move(a) : std::vector<int>{};
  }
  bool complete(const std::vector<int>& counts) const {
    for (std::size_t i = 0; i < counts.size(); ++i)
      if (got[i] < counts[i]) return false;
    return true;
  }
};

/// The cluster's nodes: free devices and distributed jobs per node, and the placement rules.
class node_pool {
 public:
  node_pool() = default;
  /// `tiresias`: the most-free-node-first rule; `cluster`: Pollux's rule for the cluster policies
  /// (at most one distributed job per node); neither: packed.
  node_pool(int nodes, int devices_per_node, bool tiresias, bool cluster)
      : per_node_(devices_per_node), tiresias_(tiresias), cluster_(cluster) {
    free_per_node_.assign(static_cast<std::size_t>(nodes), devices_per_node);
    distributed_on_node_.assign(static_cast<std::size_t>(nodes), 0);
  }

  void release(job_state& j) {
    const bool distributed = compact(j.alloc).size() > 1;
    for (std::size_t n = 0; n < j.alloc.size(); ++n) {
      free_per_node_[n] += j.alloc[n];
      if (distributed && j.alloc[n] > 0) --distributed_on_node_[n];
    }
    j.alloc.clear();
    j.devices = 0;
  }

  int free_devices() const {
    int f = 0;
    for (int c : free_per_node_) f += c;
    return f;
  }

  /// Places k devices. Packed (static, per-job policies): whole free nodes first, then the node
  /// that fits the rest most tightly, then the fullest-free nodes. Tiresias: the node with the
  /// most free devices, repeatedly (the reference's). Cluster policies: packed, but at most one
  /// distributed job per node (Pollux's rule); returns fewer than k devices when that rule leaves
  /// no room. Returns devices per node.
  std::vector<int> place(int k) { return place_on(k, free_per_node_, distributed_on_node_); }

  /// place() on explicit free-device and distributed-job counts (so a plan can be tried first).
  std::vector<int> place_on(int k, std::vector<int>& free, std::vector<int>& distributed) const {
    std::vector<int> alloc(free.size(), 0);
    const int per = per_node_;
    const std::size_t none = free.size();
    int left = k;
    if (tiresias_) {
      while (left > 0) {
        std::size_t best = none;
        for (std::size_t n = 0; n < free.size(); ++n)
          if (free[n] > 0 && (best == none || free[n] > free[best])) best = n;
        if (best == none) throw std::logic_error("place: not enough free devices");
        const int take = std::min(left, free[best]);
        alloc[best] += take, free[best] -= take, left -= take;
      }
      return alloc;
    }
    if (cluster_) {
      // One node if it fits, tightest first.
      std::size_t fit = none;
      for (std::size_t n = 0; n < free.size() && k <= per; ++n)
        if (free[n] >= k && (fit == none || free[n] < free[fit])) fit = n;
      if (fit != none) {
        alloc[fit] = k, free[fit] -= k;
        return alloc;
      }
      // Distributed: only nodes without another distributed job; whole free nodes first, then the
      // tightest node that fits the rest, then the most free.
      for (std::size_t n = 0; n < free.size() && left >= per; ++n)
        if (free[n] == per && distributed[n] == 0) alloc[n] = per, free[n] = 0, left -= per;
      while (left > 0) {
        std::size_t best = none;
        for (std::size_t n = 0; n < free.size(); ++n)
          if (alloc[n] == 0 && distributed[n] == 0 && free[n] >= left && (best == none || free[n] < free[best]))
            best = n;
        if (best == none)
          for (std::size_t n = 0; n < free.size(); ++n)
            if (alloc[n] == 0 && distributed[n] == 0 && free[n] > 0 && (best == none || free[n] > free[best])) best = n;
        if (best == none) break;
        const int take = std::min(left, free[best]);
        alloc[best] += take, free[best] -= take, left -= take;
      }
      if (compact(alloc).size() > 1)
        for (std::size_t n = 0; n < alloc.size(); ++n)
          if (alloc[n] > 0) ++distributed[n];
      return alloc;
    }
    for (std::size_t n = 0; n < free.size() && left >= per; ++n)
      if (free[n] == per) alloc[n] = per, free[n] = 0, left -= per;
    while (left > 0) {
      std::size_t best = none;
      for (std::size_t n = 0; n < free.size(); ++n)  // tightest node that fits the rest
        if (free[n] >= left && (best == none || free[n] < free[best])) best = n;
      if (best == none) {
        for (std::size_t n = 0; n < free.size(); ++n)  // otherwise the node with most free
          if (free[n] > 0 && (best == none || free[n] > free[best])) best = n;
      }
      if (best == none) throw std::logic_error("place: not enough free devices");
      const int take = std::min(left, free[best]);
      alloc[best] += take;
      free[best] -= take;
      left -= take;
    }
    return alloc;
  }

  /// Where each job would run if `counts` were applied in the order a decision applies them
  /// (shrinks, then grows biggest first): a job whose count is unchanged stays where it is.
  placement_plan plan(const std::vector<job_state*>& act, const std::vector<int>& counts) const {
    std::vector<int> free = free_per_node_, distributed = distributed_on_node_;
    placement_plan out(act.size());
    for (std::size_t i = 0; i < act.size(); ++i) {
      if (counts[i] == act[i]->devices) {
        out.alloc[i] = act[i]->alloc, out.got[i] = act[i]->devices;
        continue;
      }
      drop(*act[i], free, distributed);
    }
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < act.size(); ++i)
      if (counts[i] != act[i]->devices && counts[i] > 0 && counts[i] < act[i]->devices) order.push_back(i);
    std::vector<std::size_t> grows;
    for (std::size_t i = 0; i < act.size(); ++i)
      if (counts[i] > act[i]->devices) grows.push_back(i);
    std::stable_sort(grows.begin(), grows.end(), [&](std::size_t a, std::size_t b) { return counts[a] > counts[b]; });
    order.insert(order.end(), grows.begin(), grows.end());
    for (std::size_t i : order) out.set(i, place_on(counts[i], free, distributed));
    return out;
  }

  /// Like plan(), but every job may move (Pollux's search assigns node-level allocations, so it
  /// moves jobs to make room): distributed jobs first, biggest first, on the nodes whose other
  /// occupants are fewest; then single-node jobs. A job whose count is unchanged keeps its nodes
  /// when they are still free; one that must move is marked `moved` (charged as a restart).
  placement_plan repack(const std::vector<job_state*>& act, const std::vector<int>& counts) const {
    const std::size_t nodes = free_per_node_.size();
    std::vector<int> free(nodes, per_node_), distributed(nodes, 0);
    placement_plan out(act.size());
    // Devices each node holds now for jobs that would keep their count (what taking it displaces).
    std::vector<int> occupied(nodes, 0);
    for (std::size_t i = 0; i < act.size(); ++i)
      if (counts[i] == act[i]->devices)
        for (std::size_t n = 0; n < act[i]->alloc.size(); ++n) occupied[n] += act[i]->alloc[n];
    auto fits = [&](const std::vector<int>& a) {
      const bool dist = compact(a).size() > 1;
      for (std::size_t n = 0; n < a.size(); ++n)
        if (a[n] > 0 && (free[n] < a[n] || (dist && distributed[n] > 0))) return false;
      return true;
    };
    auto take = [&](std::size_t i, const std::vector<int>& a) {
      const bool dist = compact(a).size() > 1;
      for (std::size_t n = 0; n < a.size(); ++n)
        if (a[n] > 0) free[n] -= a[n], distributed[n] += dist ? 1 : 0;
      out.set(i, a);
    };
    auto keep_if_free = [&](std::size_t i) {
      if (counts[i] != act[i]->devices || act[i]->alloc.empty() || !fits(act[i]->alloc)) return false;
      take(i, act[i]->alloc);
      return true;
    };
    std::vector<std::size_t> big, small;
    for (std::size_t i = 0; i < act.size(); ++i)
      if (counts[i] > 0) (counts[i] > per_node_ ? big : small).push_back(i);
    auto by_size = [&](std::size_t a, std::size_t b) { return counts[a] > counts[b]; };
    std::stable_sort(big.begin(), big.end(), by_size);
    std::stable_sort(small.begin(), small.end(), by_size);
    std::vector<std::size_t> rest;
    for (std::size_t i : big)
      if (!keep_if_free(i)) rest.push_back(i);
    for (std::size_t i : rest) {
      // Whole nodes, then one node for the remainder: its own nodes first, then the least occupied.
      const auto& own = act[i]->alloc;
      auto cost = [&](std::size_t n) {
        const int mine = n < own.size() ? own[n] : 0;
        return 2 * (occupied[n] - mine) - (mine > 0 ? 1 : 0);
      };
      std::vector<std::size_t> cand;
      for (std::size_t n = 0; n < nodes; ++n)
        if (distributed[n] == 0 && free[n] > 0) cand.push_back(n);
      std::stable_sort(cand.begin(), cand.end(), [&](std::size_t a, std::size_t b) {
        if (free[a] != free[b]) return free[a] > free[b];
        return cost(a) < cost(b);
      });
      std::vector<int> a(nodes, 0);
      int left = counts[i];
      for (std::size_t n : cand) {
        if (left <= 0) break;
        if (left >= per_node_ && free[n] < per_node_) continue;
        if (left < per_node_) break;
        a[n] = per_node_, left -= per_node_;
      }
      if (left > 0) {  // the remainder: the cheapest node that holds it, else the freest ones
        std::size_t best = nodes;
        for (std::size_t n : cand)
          if (a[n] == 0 && free[n] >= left &&
              (best == nodes || cost(n) < cost(best) || (cost(n) == cost(best) && free[n] < free[best])))
            best = n;
        if (best != nodes) {
          a[best] = left, left = 0;
        } else {
          for (std::size_t n : cand)
            if (a[n] == 0 && left > 0) a[n] = std::min(left, free[n]), left -= a[n];
        }
      }
      if (compact(a).size() <= 1 && !compact(a).empty() && counts[i] > per_node_) a.assign(nodes, 0);
      take(i, a);
    }
    rest.clear();
    for (std::size_t i : small)
      if (!keep_if_free(i)) rest.push_back(i);
    for (std::size_t i : rest) {
      // Its own node when it still has room, else the tightest node that fits, else spread.
      std::size_t best = nodes;
      const auto& own = act[i]->alloc;
      for (std::size_t n = 0; n < nodes; ++n) {
        if (free[n] < counts[i]) continue;
        const bool mine = n < own.size() && own[n] > 0 && compact(own).size() == 1;
        if (mine) {
          best = n;
          break;
        }
        if (best == nodes || free[n] < free[best]) best = n;
      }
      std::vector<int> a(nodes, 0);
      if (best != nodes) {
        a[best] = counts[i];
      } else {
        std::vector<int> f = free, d = distributed;
        a = place_on(counts[i], f, d);
      }
      take(i, a);
    }
    for (std::size_t i = 0; i < act.size(); ++i)
      out.moved[i] = counts[i] == act[i]->devices && counts[i] > 0 && out.alloc[i] != act[i]->alloc;
    return out;
  }

  /// Gives a job exactly `alloc` (devices per node), which must be free.
  void take(job_state& j, const std::vector<int>& alloc) {
    const bool distributed = compact(alloc).size() > 1;
    int got = 0;
    for (std::size_t n = 0; n < alloc.size(); ++n) {
      if (alloc[n] <= 0) continue;
      if (free_per_node_[n] < alloc[n]) throw std::logic_error("take: node " + std::to_string(n) + " is full");
      free_per_node_[n] -= alloc[n];
      if (distributed) ++distributed_on_node_[n];
      got += alloc[n];
    }
    j.alloc = alloc;
    j.alloc.resize(free_per_node_.size(), 0);
    j.devices = got;
  }

  /// Throws std::logic_error when a node is over-allocated or breaks the placement rule.
  void check() const {
    for (int f : free_per_node_)
      if (f < 0 || f > per_node_) throw std::logic_error("simulator: node over-allocated");
    if (cluster_)
      for (int d : distributed_on_node_)
        if (d > 1) throw std::logic_error("simulator: two distributed jobs on one node (Pollux's placement rule)");
  }

 private:
  static void drop(const job_state& j, std::vector<int>& free, std::vector<int>& distributed) {
    const bool dist = compact(j.alloc).size() > 1;
    for (std::size_t n = 0; n < j.alloc.size(); ++n) {
      free[n] += j.alloc[n];
      if (dist && j.alloc[n] > 0) --distributed[n];
    }
  }

  int per_node_ = 1;
  bool tiresias_ = false;
  bool cluster_ = false;
  std::vector<int> free_per_node_;
  std::vector<int> distributed_on_node_;  ///< distributed jobs with devices on each node (rule: <= 1)
};

}  // namespace dra::sim::detail
