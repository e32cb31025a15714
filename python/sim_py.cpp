// Bindings of the cluster simulator (include/dra/sim/). Thin: results come back as plain dicts
// and lists, so the Python side (dra.sim) writes JSON, tables and plots without further glue.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>

#include "bindings.hpp"
#include "dra/sim/study.hpp"

namespace py = pybind11;
using namespace dra::sim;

namespace {

py::object num(double v) {
  return std::isfinite(v) ? py::object(py::float_(v)) : py::object(py::none());
}

py::dict job_to_dict(const job_result& j) {
  py::dict d;
  d["name"] = j.name;
  d["application"] = j.application;
  d["submit_s"] = j.submit_s;
  d["start_s"] = num(j.start_s);
  d["completion_s"] = num(j.completion_s);
  d["jct_s"] = num(j.jct_s);
  d["gpu_seconds"] = j.gpu_seconds;
  d["compute_gpu_seconds"] = j.compute_gpu_seconds;
  d["busy_gpu_seconds"] = j.busy_gpu_seconds;
  d["progress"] = j.progress;
  d["epochs"] = j.epochs;
  d["requested_replicas"] = j.requested_replicas;
  d["requested_batch"] = j.requested_batch;
  d["final_batch"] = j.final_batch;
  d["final_metric"] = num(j.final_metric);
  d["reached_target"] = j.reached_target;
  d["reallocations"] = j.reallocations;
  d["max_devices"] = j.max_devices;
  d["mean_devices"] = j.device_time_weighted_devices;
  return d;
}

py::dict result_to_dict(const sim_result& r) {
  py::dict d;
  d["policy"] = r.policy;
  d["capacity"] = r.capacity;
  d["reallocation_cost_s"] = r.reallocation_cost_s;
  d["makespan_s"] = r.makespan_s;
  d["first_submit_s"] = r.first_submit_s;
  d["wall_s"] = r.wall_s;
  d["all_completed"] = r.all_completed;
  py::list jobs;
  for (const auto& j : r.jobs) jobs.append(job_to_dict(j));
  d["jobs"] = jobs;
  // Timeline as columns: compact and ready for plotting.
  std::vector<double> t, frac, busy;
  std::vector<int> alloc, running, waiting;
  for (const auto& p : r.timeline) {
    t.push_back(p.time_s);
    alloc.push_back(p.allocated);
    running.push_back(p.running);
    waiting.push_back(p.waiting);
    frac.push_back(p.compute_fraction);
    busy.push_back(p.busy_fraction);
  }
  py::dict tl;
  tl["time_s"] = t;
  tl["allocated"] = alloc;
  tl["running"] = running;
  tl["waiting"] = waiting;
  tl["compute_fraction"] = frac;
  tl["busy_fraction"] = busy;
  d["timeline"] = tl;
  return d;
}

job_spec spec_from(const py::handle& o) {
  job_spec j;
  auto d = o.cast<py::dict>();
  j.name = d["name"].cast<std::string>();
  j.submit_s = d["submit_s"].cast<double>();
  j.application = d["application"].cast<std::string>();
  j.replicas = d["replicas"].cast<int>();
  j.batch = d["batch"].cast<double>();
  if (d.contains("throughput_scale")) j.throughput_scale = d["throughput_scale"].cast<double>();
  if (d.contains("gns_scale")) j.gns_scale = d["gns_scale"].cast<double>();
  if (d.contains("target_metric") && !d["target_metric"].is_none()) j.target_metric = d["target_metric"].cast<double>();
  return j;
}

py::dict spec_to_dict(const job_spec& j) {
  py::dict d;
  d["name"] = j.name;
  d["submit_s"] = j.submit_s;
  d["application"] = j.application;
  d["replicas"] = j.replicas;
  d["batch"] = j.batch;
  d["throughput_scale"] = j.throughput_scale;
  d["gns_scale"] = j.gns_scale;
  d["target_metric"] = num(j.target_metric);
  return d;
}

}  // namespace

void dra::python::bind_sim(py::module_& m) {
  m.attr("sim_in_place_resize_cost_stand_in_s") = in_place_resize_cost_stand_in_s;
  m.attr("sim_policy_names") = policy_names();
  m.attr("sim_study_baselines") = study_baselines();
  m.attr("sim_default_price_floor") = sim_config{}.cluster_price_floor;
  m.attr("sim_default_job_price_floor") = dra::policy::convergence_aware_config{}.price_floor;

  py::class_<profile_library>(m, "SimProfiles",
                              "Measured application profiles (a traces/ directory) for the simulator.")
      .def(py::init(&profile_library::load), py::arg("traces_dir"))
      .def("names", &profile_library::names)
      .def(
          "throughput",
          [](const profile_library& lib, const std::string& app, const std::vector<int>& placement, double local_bsz) {
            const step_times t = lib.at(app).throughput(placement, local_bsz);
            return py::make_tuple(t.step_s, t.sync_s);
          },
          py::arg("application"), py::arg("placement"), py::arg("local_bsz"),
          "(step_time, sync_time) interpolated at a placement (devices per node) and local batch.")
      .def(
          "grad_stats",
          [](const profile_library& lib, const std::string& app, double batch, int epoch) {
            const auto [sqr, var] = lib.at(app).grad_stats(batch, epoch);
            return py::make_tuple(sqr, var);
          },
          py::arg("application"), py::arg("batch"), py::arg("epoch"))
      .def(
          "best_metric",
          [](const profile_library& lib, const std::string& app, double batch, int epochs) {
            return lib.at(app).best_metric(batch, epochs);
          },
          py::arg("application"), py::arg("batch"), py::arg("epochs"),
          "Best validation metric over the first `epochs` epochs at total batch `batch`.")
      .def(
          "progress_at",
          [](const profile_library& lib, const std::string& app, int epoch) { return lib.at(app).progress_at(epoch); },
          py::arg("application"), py::arg("epoch"))
      .def(
          "info",
          [](const profile_library& lib, const std::string& name) {
            const auto& a = lib.at(name);
            py::dict d;
            d["init_batch"] = a.init_batch();
            d["max_batch"] = a.max_batch();
            d["min_local_batch"] = a.min_local_batch();
            d["max_local_batch"] = a.max_local_batch();
            d["max_epochs"] = a.max_epochs();
            d["max_replicas"] = a.max_replicas();
            d["metric_increases"] = a.metric_increases();
            d["placement_noise"] = a.placement_noise();
            d["gns_noise"] = a.gns_noise();
            return d;
          },
          py::arg("application"));

  m.def(
      "sim_read_workload",
      [](const std::string& path, const profile_library* profiles) {
        py::list out;
        for (const auto& j : read_workload(path, profiles)) out.append(spec_to_dict(j));
        return out;
      },
      py::arg("path"), py::arg("profiles") = nullptr,
      "Reads a workload CSV (name,time,application,num_replicas,batch_size) into job dicts; errors name file, line, "
      "column.");

  m.def(
      "sim_run",
      [](const profile_library& profiles, const py::list& jobs, const std::string& policy, double reallocation_cost_s,
         double interval_s, int nodes, int devices_per_node, double quota_scale, bool record_timeline,
         bool remaining_work_from_budget, double price_floor,
         const std::function<bool(double, std::size_t, std::size_t)>& progress) {
        std::vector<job_spec> specs;
        for (auto o : jobs) specs.push_back(spec_from(o));
        sim_config c;
        c.policy = policy;
        c.reallocation_cost_s = reallocation_cost_s;
        c.interval_s = interval_s;
        c.nodes = nodes;
        c.devices_per_node = devices_per_node;
        c.quota_scale = quota_scale;
        c.record_timeline = record_timeline;
        c.remaining_work_from_budget = remaining_work_from_budget;
        c.cluster_price_floor = price_floor;
        return result_to_dict(simulate(profiles, specs, c, progress));
      },
      py::arg("profiles"), py::arg("jobs"), py::arg("policy"), py::arg("reallocation_cost_s") = 30.0,
      py::arg("interval_s") = 60.0, py::arg("nodes") = 16, py::arg("devices_per_node") = 4,
      py::arg("quota_scale") = 0.0, py::arg("record_timeline") = true, py::arg("remaining_work_from_budget") = true,
      py::arg("price_floor") = sim_config{}.cluster_price_floor, py::arg("progress") = nullptr,
      "Simulates jobs (dicts as from sim_read_workload) on a cluster under one policy; returns a result dict.");

  m.def(
      "sim_study",
      [](const profile_library& profiles, const py::list& pool, int runs, std::uint64_t seed,
         const std::vector<std::string>& policies, double reallocation_cost_s, double quota_scale, double interval_s,
         bool noise, bool reference_limits, bool perturb, bool shared_cluster, int jobs_per_cluster, bool hindsight,
         double price_floor, const std::function<void(int, int)>& progress) {
        std::vector<job_spec> specs;
        for (auto o : pool) specs.push_back(spec_from(o));
        study_config c;
        c.runs = runs;
        c.seed = seed;
        c.policies = policies;
        c.reallocation_cost_s = reallocation_cost_s;
        c.quota_scale = quota_scale;
        c.interval_s = interval_s;
        c.noise = noise;
        c.reference_limits = reference_limits;
        c.perturb = perturb;
        c.shared_cluster = shared_cluster;
        c.jobs_per_cluster = jobs_per_cluster;
        c.hindsight = hindsight && !shared_cluster;
        c.convergence_aware.price_floor = price_floor;
        c.convergence_aware.plateau_price = std::max(c.convergence_aware.plateau_price, price_floor);
        c.convergence_aware.validate();
        std::vector<study_run> rows;
        {
          py::gil_scoped_release release;
          rows = run_study(profiles, specs, c, progress ? [&](int d, int t) {
            py::gil_scoped_acquire acquire;
            progress(d, t);
          } : std::function<void(int, int)>());
        }
        py::list out;
        for (const auto& r : rows) {
          py::dict d;
          d["index"] = r.index;
          d["cluster"] = r.cluster;
          d["spec"] = spec_to_dict(r.spec);
          d["best_size_devices"] = r.best_size_devices;
          d["hindsight_devices"] = r.hindsight_devices;
          d["hindsight_batch"] = r.hindsight_batch;
          py::dict res;
          for (const auto& [p, j] : r.results) res[py::str(p)] = job_to_dict(j);
          d["results"] = res;
          out.append(d);
        }
        return out;
      },
      py::arg("profiles"), py::arg("pool"), py::arg("runs"), py::arg("seed"), py::arg("policies"),
      py::arg("reallocation_cost_s") = in_place_resize_cost_stand_in_s, py::arg("quota_scale") = 1.0,
      py::arg("interval_s") = 60.0, py::arg("noise") = true, py::arg("reference_limits") = false,
      py::arg("perturb") = false, py::arg("shared_cluster") = false, py::arg("jobs_per_cluster") = 160,
      py::arg("hindsight") = true, py::arg("price_floor") = dra::policy::convergence_aware_config{}.price_floor,
      py::arg("progress") = nullptr,
      "Generates `runs` jobs from the request pool (seeded) and simulates each under the static baselines and every "
      "dynamic policy, alone or (shared_cluster) in groups contending for one cluster.");
}
