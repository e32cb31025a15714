#pragma once
// Where a job's devices are: the free devices of each node and the placement rules (packed,
// Tiresias's most-free-node-first, Pollux's at most one distributed job per node).
#include <cstddef>
#include <stdexcept>
#include <vector>

#include "dra/sim/job_model.hpp"

namespace dra::sim::detail {

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

  /// Devices each job would end up with if `alloc` were applied in apply_allocation's order (a dry
  /// run of the placement rule).
  std::vector<int> plan(const std::vector<job_state*>& act, const std::vector<int>& alloc) const {
    std::vector<int> free = free_per_node_, distributed = distributed_on_node_;
    std::vector<int> got(act.size());
    auto drop = [&](const job_state& j) {
      const bool dist = compact(j.alloc).size() > 1;
      for (std::size_t n = 0; n < j.alloc.size(); ++n) {
        free[n] += j.alloc[n];
        if (dist && j.alloc[n] > 0) --distributed[n];
      }
    };
    for (std::size_t i = 0; i < act.size(); ++i) {
      got[i] = act[i]->devices;
      if (alloc[i] != act[i]->devices) drop(*act[i]), got[i] = 0;
    }
    // Shrinks are placed before grows (they fit where they were), grows biggest first.
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < act.size(); ++i)
      if (alloc[i] != act[i]->devices && alloc[i] > 0 && alloc[i] < act[i]->devices) order.push_back(i);
    std::vector<std::size_t> grows;
    for (std::size_t i = 0; i < act.size(); ++i)
      if (alloc[i] > act[i]->devices) grows.push_back(i);
    std::stable_sort(grows.begin(), grows.end(), [&](std::size_t a, std::size_t b) { return alloc[a] > alloc[b]; });
    order.insert(order.end(), grows.begin(), grows.end());
    for (std::size_t i : order) {
      int sum = 0;
      for (int c : place_on(alloc[i], free, distributed)) sum += c;
      got[i] = sum;
    }
    return got;
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
  int per_node_ = 1;
  bool tiresias_ = false;
  bool cluster_ = false;
  std::vector<int> free_per_node_;
  std::vector<int> distributed_on_node_;  ///< distributed jobs with devices on each node (rule: <= 1)
};

}  // namespace dra::sim::detail
