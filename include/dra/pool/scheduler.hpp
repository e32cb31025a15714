#pragma once
// The pool's scheduler: which devices a job gets (admit: inference whose SLO is at risk first, then
// priority with aging, gang, backfilling, preemption in place; resize: sizes wanted become releases
// and grants; place: suitable devices, least fragmentation, locality). Deterministic: the same
// inventory, jobs, leases and clock give the same plan. It plans; the service carries the plan out
// and calls it again. docs/design/pool.md.
//
// Backfilling is first fit in priority order: a job that does not fit is passed over and later
// jobs take what is free, so a stream of small jobs can keep a wide one waiting for ever (in
// static mode, and with preemption too when the jobs in its way cannot shrink: rigid ones). A
// reservation stops that: a job still blocked after waiting aging_s holds every free device it
// could use, and no job behind it starts there (nor grows there, in resize) until it has started;
// only a job that would fit once every training lease has ended (see starving). Run times are unknown, so unlike
// Slurm's EASY backfill nothing is let past it on those devices (any job might delay it), and the reservation is taken
// only after aging_s (before that, backfilling may delay it). aging_s <= 0: none.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dra/error.hpp"
#include "dra/pool/inventory.hpp"
#include "dra/pool/lease.hpp"
#include "dra/pool/request.hpp"

namespace dra::pool {

/// A job as the scheduler sees it.
struct job_entry {
  request req;
  double submitted_at = 0.0;  ///< pool clock when it was submitted
  std::int64_t order = 0;     ///< arrival sequence number (ties)
  int urgent_size = 0;        ///< inference whose SLO is at risk: the replicas it needs now (0: none)
};

struct grant_order {
  std::string job;
  std::string device;
  double share = 1.0;
  std::string reason;
};

struct release_order {
  std::string job;
  std::int64_t lease = 0;
  std::string reason;
  bool preemption = false;  ///< asked for by a higher-priority job (else a rebalance)
  std::string for_job;      ///< the job it makes room for (preemption)
};

struct plan {
  std::vector<grant_order> grants;
  std::vector<release_order> releases;
  std::vector<std::string> waiting;  ///< jobs still below min_size after this plan, in priority order
  bool empty() const noexcept { return grants.empty() && releases.empty(); }
};

struct scheduler_config {
  double aging_s = 120.0;  ///< a waiting job gains one priority level per aging_s waited (<= 0: no aging)
  bool preemption = true;
  bool admit_to_request = true;  ///< admission also grants free devices up to max_size (elastic training)

  void validate() const {
    if (!std::isfinite(aging_s)) dra::detail::throw_invalid("aging_s", "must be finite (<= 0 turns aging off)");
  }
};

class scheduler {
 public:
  explicit scheduler(scheduler_config config = {}) : config_((config.validate(), config)) {}
  const scheduler_config& config() const noexcept { return config_; }

  /// Base priority level plus aging while the job waits below its minimum.
  double effective_priority(const job_entry& j, const lease_book& book, double now) const {
    double p = j.req.priority_level();
    if (config_.aging_s > 0.0 && book.count(j.req.job) < j.req.min_size)
      p += std::floor(std::max(0.0, now - j.submitted_at) / config_.aging_s);
    return p;
  }

  /// Admission: first the missing replicas of inference services whose SLO is at risk
  /// (`urgent_size`), then the missing workers of jobs below their min_size; see the file comment.
  plan admit(const inventory& inv, const std::vector<job_entry>& jobs, const lease_book& book, double now) const {
    check_jobs(jobs);
    admission a{inv, book, {}, free_shares(inv, book), std::vector<double>(inv.size(), 0.0), {}, {}, {}};
    // Devices that leases being released will give back; reserved for the jobs that asked. A job's
    // releasing leases count whether or not their device is in the inventory (a node away with a
    // Ray cluster's head keeps its leases): the count bounds preemption by the job's minimum.
    for (const auto& l : book.all())
      if (l.state == lease_state::releasing) {
        ++a.releasing_of[l.job];
        if (inv.contains(l.device)) a.incoming[inv.index_of(l.device)] += l.share;
      }
    const std::vector<const job_entry*> order = by_priority(jobs, book, now);
    for (const auto& j : jobs) a.by_name[j.req.job] = &j;
    // Inference first: a service short of what its autoscaler wants is served before any
    // admission or growth (on free devices, then on leases coming back, then by shrinking elastic
    // training of a class no higher than its own in place). Services of one class short at once
    // share what can be had, a replica at a time to the one holding the least of its want (the
    // first submitted took every free device while a second, as loaded, stayed at one replica:
    // SLO 99.6 % against 5.8 %).
    bool short_left = false;
    std::map<std::string, int> sought;  // workers the urgent pass placed, kept devices for or asked back for
    const auto want = [](const job_entry* j) { return std::min(j->urgent_size, j->req.max_size); };
    std::vector<const job_entry*> urgent;
    for (const job_entry* j : order)
      if (j->req.kind == "inference" && j->urgent_size > 0 && want(j) > book.count(j->req.job)) urgent.push_back(j);
    // One class is one base priority level, as in the scaler's plan: grouped by aging instead, a
    // service below its minimum took a group of its own and was filled, and the next plan moved a
    // replica back to its peer. Aging still orders the services inside a class.
    std::stable_sort(urgent.begin(), urgent.end(), [](const job_entry* x, const job_entry* y) {
      return x->req.priority_level() > y->req.priority_level();
    });
    for (std::size_t first = 0; first < urgent.size();) {
      const int level = urgent[first]->req.priority_level();
      std::size_t end = first + 1;
      while (end < urgent.size() && urgent[end]->req.priority_level() == level) ++end;
      std::vector<const job_entry*> open(urgent.begin() + static_cast<std::ptrdiff_t>(first),
                                         urgent.begin() + static_cast<std::ptrdiff_t>(end));
      const auto served = [&](const job_entry* j) {
        return static_cast<double>(book.count(j->req.job) + sought[j->req.job]) / want(j);
      };
      while (!open.empty()) {
        const auto it = std::min_element(open.begin(), open.end(), [&](const job_entry* x, const job_entry* y) {
          return served(x) < served(y);  // the earlier submitted on a tie
        });
        const job_entry* j = *it;
        const std::size_t arranged = a.arranged;
        const int missing = serve(a, *j, 1, true);
        short_left = short_left || missing > 0;
        const bool stuck = missing > 0 && a.arranged == arranged;  // nothing free, coming back or to take
        int& mine = sought[j->req.job];
        if (stuck)
          mine = want(j) - book.count(j->req.job);  // tried: the minimum's pass does not ask again
        else
          ++mine;
        if (stuck || book.count(j->req.job) + mine >= want(j)) open.erase(it);
      }
      first = end;
    }
    // A service the urgent pass served is not served again for its minimum: the lease book does
    // not hold this round's grants yet, and counting them twice took it past its max_size.
    for (const job_entry* j : order) {
      const auto s = sought.find(j->req.job);
      const int need = j->req.min_size - book.count(j->req.job) - (s == sought.end() ? 0 : s->second);
      if (need > 0 && serve(a, *j, need, false) > 0 && starving(inv, book, jobs, *j, need, now))
        hold(inv, a.free, j->req);
    }
    if (config_.admit_to_request && a.out.waiting.empty() && !short_left) to_request(inv, order, book, a.free, a.out);
    return a.out;
  }

  /// Resizing running jobs to wanted sizes (clamped to [min_size, max_size]; rigid jobs and jobs
  /// without a target are left alone). Waiting jobs may be listed: none is resized, and one blocked
  /// for aging_s holds its free devices against growth (as in admit). Shrinks release the newest leases; grows take
  /// free devices near the job's own, higher priority first; a grow that finds too few devices is partial.
  plan resize(const inventory& inv, const std::vector<job_entry>& jobs, const std::map<std::string, int>& targets,
              const lease_book& book, double now) const {
    check_jobs(jobs);
    plan out;
    std::vector<double> free = free_shares(inv, book);
    for (const job_entry* j : by_priority(jobs, book, now)) {
      const auto it = targets.find(j->req.job);
      if (it == targets.end() || !j->req.elastic) continue;
      const int active = book.count(j->req.job, false);
      if (active < j->req.min_size && book.count(j->req.job) < j->req.min_size) continue;  // not admitted yet
      const int target = std::clamp(it->second, j->req.min_size, j->req.max_size);
      if (target < active) {
        std::vector<lease> mine;
        for (const auto& l : book.of_job(j->req.job))
          if (l.state == lease_state::active) mine.push_back(l);
        std::sort(mine.begin(), mine.end(), [](const lease& a, const lease& b) { return a.id > b.id; });
        for (int k = 0; k < active - target; ++k)
          out.releases.push_back({j->req.job, mine[static_cast<std::size_t>(k)].id,
                                  "resize " + std::to_string(active) + " -> " + std::to_string(target), false, ""});
      }
    }
    // A waiting job that is starving holds its free devices against growth too (in `jobs`, the
    // caller's waiting jobs come with the running ones): an arbiter that does not count it (a
    // rigid job) grew an elastic job onto them, and it never started.
    for (const job_entry* j : by_priority(jobs, book, now)) {
      const int need = j->req.min_size - book.count(j->req.job);
      if (need > 0 && starving(inv, book, jobs, *j, need, now)) hold(inv, free, j->req);
    }
    for (const job_entry* j : by_priority(jobs, book, now)) {
      const auto it = targets.find(j->req.job);
      if (it == targets.end() || !j->req.elastic) continue;
      const int held = book.count(j->req.job);
      const int active = book.count(j->req.job, false);
      if (held < j->req.min_size) continue;
      const int target = std::clamp(it->second, j->req.min_size, j->req.max_size);
      if (target <= held) continue;
      const auto got = place_indices(inv, j->req, target - held, free, devices_of(book, j->req.job));
      for (std::size_t i : got) {
        free[i] -= j->req.fraction;
        out.grants.push_back({j->req.job, inv.devices()[i].id, j->req.fraction,
                              "resize " + std::to_string(active) + " -> " + std::to_string(target)});
      }
    }
    return out;
  }

  /// Devices for n more workers of a request given free shares per device (inventory order) and
  /// the devices the job holds already; fewer than n when fewer fit.
  std::vector<std::string> place(const inventory& inv, const request& req, int n, const std::vector<double>& free,
                                 const std::vector<std::string>& near) const {
    check_shape(req, "req");
    if (free.size() != inv.size())
      dra::detail::throw_invalid("free", "needs one share per device (" + std::to_string(inv.size()) + "), got " +
                                             std::to_string(free.size()));
    std::vector<std::string> ids;
    for (std::size_t i : place_indices(inv, req, n, free, near)) ids.push_back(inv.devices()[i].id);
    return ids;
  }

  /// Free share of every device (inventory order) given the leases.
  static std::vector<double> free_shares(const inventory& inv, const lease_book& book) {
    std::vector<double> free(inv.size(), 1.0);
    for (const auto& l : book.all())
      if (inv.contains(l.device)) free[inv.index_of(l.device)] -= l.share;
    for (double& f : free) f = std::max(0.0, f);
    return free;
  }

 private:
  static constexpr double eps = 1e-9;

  // What the plan needs of each request whether or not the caller ran request::validate (which
  // also checks it against the inventory): a fraction in (0, 1] (validate's finer floor is not
  // held here: a pool's stored jobs from before it must still schedule),
  // 1 <= min_size <= max_size <= max_workers (a round's work grows with max_size), and
  // each job listed once (entries are found by name).
  static void check_shape(const request& r, const std::string& where) {
    using dra::detail::throw_invalid;
    if (!(r.fraction > 0.0 && r.fraction <= 1.0))
      throw_invalid(where + ".fraction", "job '" + r.job + "': must lie in (0, 1], got " + request::shown(r.fraction) +
                                             "; run request::validate before scheduling");
    if (r.min_size < 1 || r.min_size > r.max_size || r.max_size > max_workers)
      throw_invalid(where + ".min_size", "job '" + r.job + "': needs 1 <= min_size <= max_size, got " +
                                             std::to_string(r.min_size) + " and " + std::to_string(r.max_size) +
                                             " (max_size at most " + std::to_string(max_workers) +
                                             "); run request::validate before scheduling");
  }
  static void check_jobs(const std::vector<job_entry>& jobs) {
    std::set<std::string> seen;
    for (const auto& j : jobs) {
      check_shape(j.req, "jobs");
      if (!seen.insert(j.req.job).second)
        dra::detail::throw_invalid("jobs", "job '" + j.req.job + "' is listed twice; list each job once");
    }
  }

  // One admission round's working state.
  struct admission {
    const inventory& inv;
    const lease_book& book;
    plan out;
    std::vector<double> free;                 // free share per device, after this round's grants
    std::vector<double> incoming;             // share coming back from leases being released
    std::map<std::string, int> releasing_of;  // job -> leases it is already giving back
    std::map<std::string, const job_entry*> by_name;
    std::set<std::int64_t> asked;  // leases this round already asked back
    std::size_t arranged = 0;      // workers placed on leases coming back (kept or asked back) so far
  };

  // Places `need` more workers of a job: on free devices (all at once for a gang, unless urgent),
  // else on leases already coming back (kept for it), else by preemption in place. An urgent
  // service takes what fits now and preempts for the rest; it may shrink elastic training of its
  // own class or lower, an admission only elastic jobs of a lower class. Returns what is missing.
  int serve(admission& a, const job_entry& j, int need, bool urgent) const {
    const auto& inv = a.inv;
    const std::vector<std::string> near = devices_of(a.book, j.req.job);
    std::vector<std::size_t> got = place_indices(inv, j.req, need, a.free, near);
    if (static_cast<int>(got.size()) == need || ((urgent || !j.req.gang) && !got.empty())) {
      for (std::size_t i : got) {
        a.free[i] -= j.req.fraction;
        a.out.grants.push_back({j.req.job, inv.devices()[i].id, j.req.fraction, urgent ? "inference first" : "admit"});
      }
      need -= static_cast<int>(got.size());
      if (need == 0) return 0;
      if (!urgent) {
        a.out.waiting.push_back(j.req.job);
        return need;
      }
    } else if (!urgent) {
      a.out.waiting.push_back(j.req.job);
    }
    // Would the leases already coming back make room? Then wait for them (and keep them).
    std::vector<double> with_incoming = a.free;
    for (std::size_t i = 0; i < a.free.size(); ++i) with_incoming[i] += a.incoming[i];
    got = place_indices(inv, j.req, need, with_incoming, near);
    if (static_cast<int>(got.size()) == need) {
      reserve(a.free, a.incoming, got, j.req.fraction);
      a.arranged += got.size();
      return need;
    }
    if (!config_.preemption) return need;
    // Preemption: shrink elastic jobs in place, lowest class and newest job first, newest lease
    // first; only if that makes the job fit (else nothing), never below a victim's minimum.
    std::vector<lease> victims;
    for (const auto& l : a.book.all()) {
      if (l.state != lease_state::active || !inv.contains(l.device) || a.asked.count(l.id)) continue;
      const auto it = a.by_name.find(l.job);
      if (it == a.by_name.end() || !it->second->req.elastic || l.job == j.req.job) continue;
      const request& v = it->second->req;
      if (urgent ? (v.kind != "training" || v.priority_level() > j.req.priority_level())
                 : v.priority_level() >= j.req.priority_level())
        continue;
      if (!j.req.suits(inv.at(l.device))) continue;
      victims.push_back(l);
    }
    std::stable_sort(victims.begin(), victims.end(), [&](const lease& x, const lease& y) {
      const job_entry* jx = a.by_name.at(x.job);
      const job_entry* jy = a.by_name.at(y.job);
      return std::make_tuple(jx->req.priority_level(), -jx->order, -x.id) <
             std::make_tuple(jy->req.priority_level(), -jy->order, -y.id);
    });
    std::vector<double> trial = with_incoming;
    std::map<std::string, int> taken;
    std::vector<const lease*> chosen;
    bool fits = false;
    for (const auto& v : victims) {
      const job_entry* vj = a.by_name.at(v.job);
      const int keeps = a.book.count(v.job) - a.releasing_of[v.job] - taken[v.job];
      if (keeps <= vj->req.min_size) continue;  // never below its minimum
      ++taken[v.job];
      trial[inv.index_of(v.device)] += v.share;
      chosen.push_back(&v);
      got = place_indices(inv, j.req, need, trial, near);
      if (static_cast<int>(got.size()) == need) {
        fits = true;
        break;
      }
    }
    if (!fits) return need;
    for (const lease* v : chosen) {
      a.out.releases.push_back({v->job, v->id, "preempted for " + j.req.job, true, j.req.job});
      a.asked.insert(v->id);
      ++a.releasing_of[v->job];
      a.incoming[inv.index_of(v->device)] += v->share;
    }
    reserve(a.free, a.incoming, got, j.req.fraction);
    a.arranged += got.size();
    return need;
  }

  std::vector<const job_entry*> by_priority(const std::vector<job_entry>& jobs, const lease_book& book,
                                            double now) const {
    std::vector<const job_entry*> order;
    for (const auto& j : jobs) order.push_back(&j);
    std::stable_sort(order.begin(), order.end(), [&](const job_entry* a, const job_entry* b) {
      const double pa = effective_priority(*a, book, now), pb = effective_priority(*b, book, now);
      if (pa != pb) return pa > pb;
      return a->order < b->order;
    });
    return order;
  }

  // Admission to the request: every elastic training job admitted in `out` gets free devices up
  // to its max_size (priority order), placed near the ones it was just granted.
  void to_request(const inventory& inv, const std::vector<const job_entry*>& order, const lease_book& book,
                  std::vector<double>& free, plan& out) const {
    for (const job_entry* j : order) {
      if (!j->req.elastic || j->req.kind != "training" || book.count(j->req.job) > 0) continue;
      std::vector<std::string> near;
      for (const auto& g : out.grants)
        if (g.job == j->req.job) near.push_back(g.device);
      const int more = j->req.max_size - static_cast<int>(near.size());
      if (near.empty() || more <= 0) continue;
      for (std::size_t i : place_indices(inv, j->req, more, free, near)) {
        free[i] -= j->req.fraction;
        out.grants.push_back({j->req.job, inv.devices()[i].id, j->req.fraction, "admit to request"});
      }
    }
  }

  static std::vector<std::string> devices_of(const lease_book& book, const std::string& job) {
    std::vector<std::string> d;
    for (const auto& l : book.of_job(job)) d.push_back(l.device);
    return d;
  }

  // A blocked job that has waited aging_s or more (see the file comment): it holds the free devices
  // it could use. Only one that would fit once every training lease has ended: not one kept out by
  // leases that need not end (an inference service's, or a job the pool no longer lists), which
  // would hold the devices it took for ever and idle them (an outside review: small jobs and a
  // critical one waited 600 s behind such a hold), nor one the inventory cannot hold at all (a node
  // left since it was submitted).
  bool starving(const inventory& inv, const lease_book& book, const std::vector<job_entry>& jobs, const job_entry& j,
                int need, double now) const {
    if (!(config_.aging_s > 0.0 && now - j.submitted_at >= config_.aging_s)) return false;
    std::map<std::string, const request*> known;
    for (const auto& e : jobs) known[e.req.job] = &e.req;
    std::vector<double> back(inv.size(), 1.0);  // what each device will have once training ends
    for (const auto& l : book.all()) {
      const auto it = known.find(l.job);
      const bool ends = l.state == lease_state::releasing || (it != known.end() && it->second->kind == "training");
      if (inv.contains(l.device) && !ends) back[inv.index_of(l.device)] -= l.share;
    }
    for (double& b : back) b = std::max(0.0, b);
    return static_cast<int>(place_indices(inv, j.req, need, back, {}).size()) == need;
  }
  static void hold(const inventory& inv, std::vector<double>& free, const request& req) {
    for (std::size_t i = 0; i < free.size(); ++i)
      if (req.suits(inv.devices()[i])) free[i] = 0.0;
  }

  // The devices planned for a waiting job come out of `incoming` (and `free`, when the planned
  // placement used free share), so later jobs of this round cannot take them.
  static void reserve(std::vector<double>& free, std::vector<double>& incoming, const std::vector<std::size_t>& got,
                      double fraction) {
    for (std::size_t i : got) {
      double f = fraction;
      const double from_incoming = std::min(incoming[i], f);
      incoming[i] -= from_incoming;
      f -= from_incoming;
      free[i] = std::max(0.0, free[i] - f);
    }
  }

  std::vector<std::size_t> place_indices(const inventory& inv, const request& req, int n, std::vector<double> free,
                                         const std::vector<std::string>& near) const {
    const auto& devs = inv.devices();
    const double frac = req.fraction;
    auto fits = [&](std::size_t i) { return req.suits(devs[i]) && free[i] + eps >= frac; };
    std::set<std::pair<std::string, int>> groups;
    std::set<std::string> nodes;
    for (const auto& id : near)
      if (inv.contains(id)) {
        const auto& d = inv.at(id);
        groups.insert({d.node, d.group});
        nodes.insert(d.node);
      }
    std::vector<std::size_t> got;
    if (n <= 0) return got;
    if (groups.empty()) {
      // Where to start: the smallest locality group that holds all n; else the smallest node that
      // holds all n (from its largest group); else the largest node. Map order breaks ties.
      // Workers that fit, in double: a small fraction fits more than an int holds.
      std::map<std::pair<std::string, int>, double> group_room;
      std::map<std::string, double> node_room;
      for (std::size_t i = 0; i < devs.size(); ++i)
        if (req.suits(devs[i])) {
          const double r = std::floor(free[i] / frac + eps);
          group_room[{devs[i].node, devs[i].group}] += r;
          node_room[devs[i].node] += r;
        }
      auto pick = [n](const auto& room, auto& best) {  // smallest that holds n, else largest
        double best_room = -1.0;
        bool best_holds = false;
        for (const auto& [key, r] : room) {
          if (r <= 0) continue;
          const bool holds = r >= n;
          if (best_room < 0 || (holds && !best_holds) || (holds && best_holds && r < best_room) ||
              (!holds && !best_holds && r > best_room))
            best = key, best_room = r, best_holds = holds;
        }
        return best_room < 0 ? 0 : (best_holds ? 2 : 1);
      };
      std::pair<std::string, int> g;
      if (pick(group_room, g) == 2) {
        groups.insert(g);
        nodes.insert(g.first);
      } else {
        std::string node;
        if (pick(node_room, node) == 0) return got;
        nodes.insert(node);
        std::map<std::pair<std::string, int>, double> inside;  // its largest group first
        for (const auto& [key, r] : group_room)
          if (key.first == node) inside[key] = r;
        double most = 0.0;
        for (const auto& [key, r] : inside)
          if (r > most) most = r, g = key;
        groups.insert(g);
      }
    }
    for (int w = 0; w < n; ++w) {
      std::size_t best = devs.size();
      std::tuple<int, double, std::size_t> best_key{3, 2.0, 0};
      for (std::size_t i = 0; i < devs.size(); ++i) {
        if (!fits(i)) continue;
        const int where = groups.count({devs[i].node, devs[i].group}) ? 0 : (nodes.count(devs[i].node) ? 1 : 2);
        const std::tuple<int, double, std::size_t> key{where, free[i] - frac, i};
        if (best == devs.size() || key < best_key) best = i, best_key = key;
      }
      if (best == devs.size()) break;
      free[best] -= frac;
      got.push_back(best);
      groups.insert({devs[best].node, devs[best].group});
      nodes.insert(devs[best].node);
    }
    return got;
  }

  scheduler_config config_;
};

}  // namespace dra::pool
