#pragma once
// The one table of policies: a name maps to its settings section, where it can run (the live
// engine, the simulator and how the simulator schedules it) and, for a per-job policy, its factory.
// The engine (engine.hpp), the simulator (sim/config.hpp, sim/cluster.hpp), the bindings and
// dra's options all read it, so an entry added here is selectable by name everywhere at once;
// policy_registry::add reaches only the program that calls it (each Python module has its own table).
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"
#include "dra/policy/convergence_aware.hpp"
#include "dra/policy/energy_policies.hpp"
#include "dra/policy/policies.hpp"

namespace dra::policy {

/// The settings sections policies read. engine_config and sim::sim_config both derive from it,
/// so a section added here is an option of the engine, of the simulator and of dra.Controller.
struct policy_sections {
  convergence_phase_config convergence;
  goodput_config goodput;
  convergence_aware_config convergence_aware;
  energy_policy_config energy;
};

/// Names of the members of policy_sections (the option names that set them), in declaration order.
inline const std::vector<std::string>& policy_section_names() {
  static const std::vector<std::string> names{"convergence", "goodput", "convergence_aware", "energy"};
  return names;
}

/// How the simulator schedules a policy.
enum class sim_scheduler {
  none,                ///< not in the simulator
  first_come,          ///< requests as made, first come first served with backfilling (static)
  tiresias,            ///< two-queue least-attained-service, preemptive (the reference's baseline)
  per_job,             ///< each job runs its own policy object (the live-job code)
  cluster,             ///< divides the cluster among jobs: the arbiter, Pollux, or a dra::sim::add_cluster_policy one
  cluster_or_per_job,  ///< the arbiter on a shared cluster; the job's own policy when alone
};

struct policy_entry {
  std::string name;
  std::string section;  ///< the policy_sections member holding its settings ("" when none)
  bool engine = false;  ///< the live engine can run it (needs `make`)
  sim_scheduler simulator = sim_scheduler::none;
  /// How its system changes a job's devices: in place (dra's resize) or by checkpoint and restart
  /// (Pollux's and Tiresias's systems, a static job's launch). The simulator's system view charges
  /// each mechanism its own measured cost; the policy-quality view charges all the same.
  bool in_place = false;
  std::string summary;  ///< one line for listings
  /// Builds the per-job policy from the settings (empty for schedulers that are not policy objects).
  std::function<std::shared_ptr<const policy>(const policy_sections&)> make;
};

class policy_registry {
 public:
  /// Every entry, in the order reports list them.
  static const std::vector<policy_entry>& entries() { return table(); }

  static const policy_entry* find(const std::string& name) {
    for (const auto& e : table())
      if (e.name == name) return &e;
    return nullptr;
  }

  /// The entry named `name` that can run where asked (engine or simulator); otherwise
  /// std::invalid_argument listing the names that can.
  static const policy_entry& at(const std::string& name, bool for_engine) {
    const policy_entry* e = find(name);
    if (e && (for_engine ? e->engine : e->simulator != sim_scheduler::none)) return *e;
    std::string known;
    for (const auto& n : names(for_engine)) known += (known.empty() ? "'" : ", '") + n + "'";
    dra::detail::throw_invalid("policy", "unknown policy '" + name + "' for the " +
                                             (for_engine ? "engine" : "simulator") + "; use one of " + known);
  }

  /// Names runnable by the live engine (for_engine) or by the simulator, in registry order. The
  /// same vector each call; add() and remove() update it in place (a reference held across them
  /// read as empty). The table is not locked: register policies before threads use it.
  static const std::vector<std::string>& names(bool for_engine) {
    auto& cache = for_engine ? names_cache().first : names_cache().second;
    if (cache.empty()) refresh_names();
    return cache;
  }

  /// Adds a policy (a name not yet taken, of letters, digits, '_', '-' and '.', starting with a
  /// letter or digit, and not "oracle_..."; a section that exists or ""; engine entries need a factory).
  static void add(policy_entry entry) {
    if (entry.name.empty() || find(entry.name))
      dra::detail::throw_invalid("name", "policy name '" + entry.name + "' is empty or already registered");
    if (!valid_name(entry.name))
      dra::detail::throw_invalid("name", "'" + printable(entry.name) +
                                             "' cannot name a policy (it is a command-line value and an item of "
                                             "lists); use letters, digits, '_', '-' and '.', starting with a letter "
                                             "or digit (e.g. 'my_policy')");
    // The simulator hands the built-in oracle_ policies each job's true remaining work, and reports
    // read the prefix as "an upper bound": a registered policy must not be taken for one.
    if (entry.name.rfind("oracle_", 0) == 0)
      dra::detail::throw_invalid("name", "'" + entry.name +
                                             "': the prefix 'oracle_' is kept for dra's built-in upper bounds "
                                             "(reported apart, never as a result); name your policy otherwise");
    // These two name dra's built-in baselines' schedules: an entry of them ran the static or the
    // Tiresias baseline under its own name, whatever its factory (and its factory in the engine).
    if (entry.simulator == sim_scheduler::first_come || entry.simulator == sim_scheduler::tiresias)
      dra::detail::throw_invalid("simulator", "policy '" + entry.name +
                                                  "': sim_scheduler::first_come and ::tiresias run dra's built-in "
                                                  "static and Tiresias baselines, not a registered policy; use "
                                                  "per_job (its factory), or dra::sim::add_cluster_policy");
    const auto& s = policy_section_names();
    if (!entry.section.empty() && std::find(s.begin(), s.end(), entry.section) == s.end())
      dra::detail::throw_invalid("section", "no settings section '" + entry.section + "' (policy_sections)");
    const bool needs_factory = entry.engine || entry.simulator == sim_scheduler::per_job ||
                               entry.simulator == sim_scheduler::cluster_or_per_job;
    if (needs_factory && !entry.make)
      dra::detail::throw_invalid("make", "policy '" + entry.name + "' runs per job and needs a factory");
    table().push_back(std::move(entry));
    refresh_names();
  }

  /// Removes an entry added with add() (tests); built-in entries stay.
  static void remove(const std::string& name) {
    auto& t = table();
    for (std::size_t i = builtin_count(); i < t.size(); ++i)
      if (t[i].name == name) t.erase(t.begin() + static_cast<std::ptrdiff_t>(i));
    refresh_names();
  }

 private:
  static bool valid_name(const std::string& n) {
    const auto alnum = [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    };
    if (n.size() > 128 || !alnum(n.front())) return false;
    return std::all_of(n.begin(), n.end(), [&](char c) { return alnum(c) || c == '_' || c == '-' || c == '.'; });
  }
  static std::string printable(const std::string& n) {
    std::string out;
    for (const char c : n.substr(0, 128)) {
      const auto u = static_cast<unsigned char>(c);
      out += (u < 0x20 || u >= 0x7f) ? '?' : c;
    }
    return out;
  }

  static void refresh_names() {
    auto& [engine, simulator] = names_cache();
    engine.clear();
    simulator.clear();
    for (const auto& e : table()) {
      if (e.engine) engine.push_back(e.name);
      if (e.simulator != sim_scheduler::none) simulator.push_back(e.name);
    }
  }
  static std::pair<std::vector<std::string>, std::vector<std::string>>& names_cache() {
    static std::pair<std::vector<std::string>, std::vector<std::string>> c;
    return c;
  }
  static std::size_t builtin_count() { return builtin().size(); }
  static std::vector<policy_entry>& table() {
    static std::vector<policy_entry> t = builtin();
    return t;
  }

  static const std::vector<policy_entry>& builtin() {
    static const std::vector<policy_entry> t = [] {
      using s = sim_scheduler;
      std::vector<policy_entry> v;
      v.push_back(
          {"static", "", false, s::first_come, false, "each job gets what it requested, never resized", nullptr});
      v.push_back({"tiresias", "", false, s::tiresias, false, "two-queue least-attained-service, preemptive", nullptr});
      v.push_back({"convergence", "convergence", true, s::per_job, true,
                   "the DRA framework's rule: grow while learning is fast and scaling efficient, release on plateau",
                   [](const policy_sections& c) { return std::make_shared<convergence_phase_policy>(c.convergence); }});
      v.push_back({"goodput", "goodput", true, s::per_job, true, "Pollux's size rule at the user's batch",
                   [](const policy_sections& c) { return std::make_shared<goodput_policy>(c.goodput); }});
      v.push_back(
          {"convergence_aware", "convergence_aware", true, s::cluster_or_per_job, true,
           "goodput over size and batch with a price per device; on a cluster, ranked by remaining work",
           [](const policy_sections& c) { return std::make_shared<convergence_aware_policy>(c.convergence_aware); }});
      v.push_back(
          {"arbiter", "", false, s::cluster, true, "dra's arbiter over goodput curves at the fair share", nullptr});
      v.push_back({"pollux", "", false, s::cluster, false, "Pollux's objective and rules in this simulator", nullptr});
      v.push_back(
          {"oracle_convergence_aware", "convergence_aware", false, s::cluster_or_per_job, true,
           "upper bound, not a result: convergence_aware handed each job's true remaining epochs",
           [](const policy_sections& c) { return std::make_shared<convergence_aware_policy>(c.convergence_aware); }});
      for (energy_objective_kind kind :
           {energy_objective_kind::min_energy_deadline, energy_objective_kind::energy_delay,
            energy_objective_kind::zeus_cost, energy_objective_kind::energy_budget})
        v.push_back({to_string(kind), "energy", true, s::none, true, "energy objective (energy section)",
                     [kind](const policy_sections& c) {
                       energy_policy_config e = c.energy;
                       e.objective.kind = kind;
                       return std::make_shared<energy_policy>(e);
                     }});
      v.push_back({"none", "", true, s::none, true, "resizes only when asked (a schedule, an outside limit)",
                   [](const policy_sections&) { return std::make_shared<hold_policy>(); }});
      return v;
    }();
    return t;
  }
};

}  // namespace dra::policy
