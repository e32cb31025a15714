// dra._core.pool: the device pool's core (include/dra/pool/) and the cluster arbiter, for the
// pool service in python/dra/pool/. Plain data types are bound field by field; bad input raises
// ValueError naming the field (std::invalid_argument).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "dra/policy/cluster_arbiter.hpp"
#include "dra/pool/inventory.hpp"
#include "dra/pool/lease.hpp"
#include "dra/pool/request.hpp"
#include "dra/pool/scaler.hpp"
#include "dra/pool/scheduler.hpp"
#include "kwargs_init.hpp"

namespace py = pybind11;
using namespace dra::pool;

namespace dra::python {

void bind_pool(py::module_& root) {
  py::module_ m =
      root.def_submodule("pool", "The device pool's core: inventory, requests, scheduler, leases, scaling.");

  py::class_<device> dev(m, "Device", "One device of the pool (a GPU, a MIG instance, a CPU slot).");
  def_kwargs_init<device>(dev);
  dev.def_readwrite("id", &device::id)
      .def_readwrite("type", &device::type)
      .def_readwrite("node", &device::node)
      .def_readwrite("group", &device::group, "Locality island inside the node (same group = close).")
      .def_readwrite("memory_gb", &device::memory_gb)
      .def_readwrite("compute", &device::compute)
      .def_readwrite("enforcement", &device::enforcement, "cgroup, cuda_visible_devices, mps or soft.")
      .def("validate", &device::validate)
      .def("__repr__", [](const device& d) { return "<Device " + d.id + " " + d.type + " on " + d.node + ">"; });

  py::class_<inventory>(m, "Inventory", "The pool's devices, in a fixed order.")
      .def(py::init<>())
      .def(py::init<std::vector<device>>(), py::arg("devices"))
      .def("add", &inventory::add, py::arg("device"))
      .def("remove_node", &inventory::remove_node, py::arg("node"), "Removes a node's devices; returns their ids.")
      .def_property_readonly("devices", &inventory::devices)
      .def("contains", &inventory::contains, py::arg("id"))
      .def("at", &inventory::at, py::arg("id"), py::return_value_policy::copy)
      .def("types", &inventory::types)
      .def("max_memory_gb", &inventory::max_memory_gb, py::arg("type"))
      .def("__len__", &inventory::size);

  py::class_<request> req(m, "Request", "What a workload asks for; validate(inventory) names the field and the fix.");
  def_kwargs_init<request, false>(req);
  req.def_readwrite("job", &request::job)
      .def_readwrite("kind", &request::kind)
      .def_readwrite("device_type", &request::device_type)
      .def_readwrite("memory_gb", &request::memory_gb)
      .def_readwrite("fraction", &request::fraction)
      .def_readwrite("min_size", &request::min_size)
      .def_readwrite("max_size", &request::max_size)
      .def_readwrite("priority", &request::priority)
      .def_readwrite("elastic", &request::elastic)
      .def_readwrite("gang", &request::gang)
      .def("validate", &request::validate, py::arg("inventory"))
      .def("priority_level", &request::priority_level);
  m.def("priority_names", &priority_names);
  m.attr("MIN_FRACTION") = dra::pool::min_fraction;
  m.attr("MAX_WORKERS") = dra::pool::max_workers;

  py::class_<lease>(m, "Lease", "A share of one device held by one worker of one job.")
      .def(py::init<>())
      .def_readwrite("id", &lease::id)
      .def_readwrite("job", &lease::job)
      .def_readwrite("device", &lease::device)
      .def_readwrite("share", &lease::share)
      .def_readwrite("granted_at", &lease::granted_at)
      .def_readwrite("heartbeat_at", &lease::heartbeat_at)
      .def_property(
          "state", [](const lease& l) { return std::string(to_string(l.state)); },
          [](lease& l, const std::string& s) {
            if (s != "active" && s != "releasing")
              dra::detail::throw_invalid("state", "must be 'active' or 'releasing', got '" + s + "'");
            l.state = s == "active" ? lease_state::active : lease_state::releasing;
          });

  py::class_<lease_book>(m, "LeaseBook", "The leases handed out; ids never repeat.")
      .def(py::init<>())
      .def("grant", &lease_book::grant, py::arg("inventory"), py::arg("job"), py::arg("device"), py::arg("share"),
           py::arg("now"), py::return_value_policy::copy)
      .def("restore", &lease_book::restore, py::arg("lease"))
      .def("release", &lease_book::release, py::arg("id"))
      .def("mark_releasing", &lease_book::mark_releasing, py::arg("id"))
      .def("heartbeat", &lease_book::heartbeat, py::arg("id"), py::arg("now"))
      .def("contains", &lease_book::contains, py::arg("id"))
      .def("at", &lease_book::at, py::arg("id"), py::return_value_policy::copy)
      .def("expired", &lease_book::expired, py::arg("now"), py::arg("timeout_s"))
      .def("free_share", &lease_book::free_share, py::arg("device"))
      .def("of_job", &lease_book::of_job, py::arg("job"))
      .def("count", &lease_book::count, py::arg("job"), py::arg("include_releasing") = true)
      .def("all", &lease_book::all)
      .def_property_readonly("next_id", &lease_book::next_id)
      .def("set_next_id", &lease_book::set_next_id, py::arg("id"))
      .def("__len__", &lease_book::size);

  py::class_<job_entry>(m, "JobEntry", "A job as the scheduler sees it.")
      .def(py::init([](request r, double submitted_at, std::int64_t order, int urgent_size) {
             return job_entry{std::move(r), submitted_at, order, urgent_size};
           }),
           py::arg("request"), py::arg("submitted_at"), py::arg("order"), py::arg("urgent_size") = 0)
      .def_readwrite("request", &job_entry::req)
      .def_readwrite("submitted_at", &job_entry::submitted_at)
      .def_readwrite("order", &job_entry::order)
      .def_readwrite("urgent_size", &job_entry::urgent_size,
                     "Inference whose SLO is at risk: the replicas it needs now, served before admission.");

  py::class_<grant_order>(m, "GrantOrder")
      .def_readonly("job", &grant_order::job)
      .def_readonly("device", &grant_order::device)
      .def_readonly("share", &grant_order::share)
      .def_readonly("reason", &grant_order::reason);
  py::class_<release_order>(m, "ReleaseOrder")
      .def_readonly("job", &release_order::job)
      .def_readonly("lease", &release_order::lease)
      .def_readonly("reason", &release_order::reason)
      .def_readonly("preemption", &release_order::preemption)
      .def_readonly("for_job", &release_order::for_job);
  py::class_<plan>(m, "Plan", "Grants and releases the scheduler asks for, and the jobs still waiting.")
      .def_readonly("grants", &plan::grants)
      .def_readonly("releases", &plan::releases)
      .def_readonly("waiting", &plan::waiting)
      .def("empty", &plan::empty);

  py::class_<scheduler_config> sc(m, "SchedulerConfig");
  def_kwargs_init<scheduler_config>(sc);
  sc.def_readwrite("aging_s", &scheduler_config::aging_s)
      .def_readwrite("preemption", &scheduler_config::preemption)
      .def_readwrite("admit_to_request", &scheduler_config::admit_to_request);

  py::class_<scheduler>(m, "Scheduler", "Deterministic placement, admission with priority/aging/preemption, resizing.")
      .def(py::init<scheduler_config>(), py::arg_v("config", scheduler_config{}, "SchedulerConfig()"))
      .def("admit", &scheduler::admit, py::arg("inventory"), py::arg("jobs"), py::arg("book"), py::arg("now"))
      .def("resize", &scheduler::resize, py::arg("inventory"), py::arg("jobs"), py::arg("targets"), py::arg("book"),
           py::arg("now"))
      .def("place", &scheduler::place, py::arg("inventory"), py::arg("request"), py::arg("n"), py::arg("free"),
           py::arg("near"))
      .def("effective_priority", &scheduler::effective_priority, py::arg("job"), py::arg("book"), py::arg("now"))
      .def_static("free_shares", &scheduler::free_shares, py::arg("inventory"), py::arg("book"));

  py::class_<autoscaler_config> ac(m, "AutoscalerConfig", "Replica autoscaling with a hysteresis band.");
  def_kwargs_init<autoscaler_config>(ac);
  ac.def_readwrite("replica_rps", &autoscaler_config::replica_rps)
      .def_readwrite("up_utilisation", &autoscaler_config::up_utilisation)
      .def_readwrite("target_utilisation", &autoscaler_config::target_utilisation)
      .def_readwrite("down_utilisation", &autoscaler_config::down_utilisation)
      .def_readwrite("down_delay_s", &autoscaler_config::down_delay_s)
      .def_readwrite("peak_window_s", &autoscaler_config::peak_window_s)
      .def_readwrite("queue_per_replica", &autoscaler_config::queue_per_replica)
      .def_readwrite("min_replicas", &autoscaler_config::min_replicas)
      .def_readwrite("max_replicas", &autoscaler_config::max_replicas);
  py::class_<replica_autoscaler>(m, "ReplicaAutoscaler")
      .def(py::init<autoscaler_config>(), py::arg("config"))
      .def("update", &replica_autoscaler::update, py::arg("now"), py::arg("rate_rps"), py::arg("queue"),
           py::arg("current"), py::arg("replica_rps") = 0.0, py::arg("serving") = -1)
      .def("mean_load", &replica_autoscaler::mean_load, py::arg("now"))
      .def("peak_needed", &replica_autoscaler::peak_needed)
      .def("forget_peaks", &replica_autoscaler::forget_peaks);

  py::class_<scale_job> sj(m, "ScaleJob", "A running job as the scaler sees it.");
  sj.def(py::init<>())
      .def_readwrite("job", &scale_job::job)
      .def_readwrite("kind", &scale_job::kind)
      .def_readwrite("priority", &scale_job::priority)
      .def_readwrite("elastic", &scale_job::elastic)
      .def_readwrite("min_size", &scale_job::min_size)
      .def_readwrite("max_size", &scale_job::max_size)
      .def_readwrite("current", &scale_job::current)
      .def_readwrite("speedup", &scale_job::speedup)
      .def_readwrite("change_penalty", &scale_job::change_penalty)
      .def_readwrite("replicas_wanted", &scale_job::replicas_wanted)
      .def_readwrite("remaining_size_s", &scale_job::remaining_size_s,
                     "Remaining work in seconds on one worker (the remaining-work estimator); < 0: unknown.");

  py::class_<dra::policy::arbiter_config> arc(m, "ArbiterConfig", "The cluster arbiter's objective (power mean).");
  def_kwargs_init<dra::policy::arbiter_config>(arc);
  arc.def_readwrite("p", &dra::policy::arbiter_config::p)
      .def_readwrite("epsilon", &dra::policy::arbiter_config::epsilon)
      .def_readwrite("max_moves", &dra::policy::arbiter_config::max_moves);
  py::class_<dra::policy::arbiter_job>(m, "ArbiterJob")
      .def(py::init<>())
      .def_readwrite("speedup", &dra::policy::arbiter_job::speedup)
      .def_readwrite("current", &dra::policy::arbiter_job::current)
      .def_readwrite("change_penalty", &dra::policy::arbiter_job::change_penalty)
      .def_readwrite("min_devices", &dra::policy::arbiter_job::min_devices)
      .def_readwrite("presence", &dra::policy::arbiter_job::presence,
                     "Value of holding any device, added at every k >= 1 and never scaled by the change penalty.");
  py::class_<dra::policy::cluster_arbiter>(m, "ClusterArbiter",
                                           "include/dra/policy/cluster_arbiter.hpp (the simulator's).")
      .def(py::init<dra::policy::arbiter_config>(),
           py::arg_v("config", dra::policy::arbiter_config{}, "ArbiterConfig()"))
      .def("allocate", &dra::policy::cluster_arbiter::allocate, py::arg("jobs"), py::arg("capacity"),
           py::call_guard<py::gil_scoped_release>());

  py::class_<dra::policy::completion_config> cc(m, "CompletionConfig",
                                                "How remaining work tilts the arbitration (convergence_aware's).");
  def_kwargs_init<dra::policy::completion_config>(cc);
  cc.def_readwrite("exponent", &dra::policy::completion_config::exponent)
      .def_readwrite("tilt", &dra::policy::completion_config::tilt)
      .def_readwrite("power", &dra::policy::completion_config::power)
      .def_readwrite("admission", &dra::policy::completion_config::admission,
                     "Value of holding any device (times the job's weight) under power > 0: waiting jobs start first.")
      .def("validate", &dra::policy::completion_config::validate);
  m.def(
      "plan_sizes",
      [](const std::vector<scale_job>& jobs, int capacity, const dra::policy::cluster_arbiter& arbiter,
         const dra::policy::completion_config* completion) { return plan_sizes(jobs, capacity, arbiter, completion); },
      py::arg("jobs"), py::arg("capacity"), py::arg("arbiter"), py::arg("completion") = nullptr,
      "Wanted sizes per job: rigid jobs keep theirs, inference replicas first, the arbiter divides the rest (tilted "
      "by remaining work with `completion`).");
  m.def("completion_weights", &dra::policy::completion_weights, py::arg("size"), py::arg("exponent"),
        "heSRPT weights by remaining size (largest first gets 1).");
  m.def("priority_weight", &priority_weight, py::arg("priority"));
}

}  // namespace dra::python
