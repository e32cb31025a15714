// Bindings of the cluster simulator (include/dra/sim/). Thin: results come back as plain dicts
// and lists (to_dict.hpp, from the result classes bound here), so the Python side (dra.sim) writes
// JSON, tables and plots without further glue.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>

#include "bindings.hpp"
#include "dra/sim/cluster_policy.hpp"
#include "dra/sim/study.hpp"
#include "dra/version.hpp"
#include "to_dict.hpp"

namespace py = pybind11;
using namespace dra::sim;

namespace {

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
  if (d.contains("declared_epochs") && !d["declared_epochs"].is_none())
    j.declared_epochs = d["declared_epochs"].cast<double>();
  if (d.contains("declared_from_file")) j.declared_from_file = d["declared_from_file"].cast<bool>();
  if (d.contains("stop_patience")) j.stop_patience = d["stop_patience"].cast<int>();
  if (d.contains("stop_min_delta")) j.stop_min_delta = d["stop_min_delta"].cast<double>();
  if (d.contains("gns_estimate_sigma")) j.gns_estimate_sigma = d["gns_estimate_sigma"].cast<double>();
  if (d.contains("target_by_work")) j.target_by_work = d["target_by_work"].cast<bool>();
  return j;
}

/// What a Python cluster policy reads of a job: its view's observable fields (job_model.hpp).
py::dict view_dict(const job_view& v) {
  py::dict d;
  d["name"] = v.name;
  d["job_class"] = v.job_class;
  d["submit_s"] = v.submit_s;
  d["requested_replicas"] = v.requested_replicas;
  d["requested_batch"] = v.requested_batch;
  d["declared_epochs"] =
      std::isnan(v.declared_epochs) ? py::object(py::none()) : py::object(py::float_(v.declared_epochs));
  d["max_devices"] = v.max_devices;
  d["devices"] = v.devices;
  d["restarts"] = v.restarts;
  d["attained_device_s"] = v.attained;
  d["epochs_done"] = v.epochs_done;
  d["work_done"] = v.work_done;
  d["last_batch"] = v.last_batch;
  return d;
}

/// What a Python cluster policy is handed: the decision's inputs while its call lasts. A policy
/// that keeps it (self.prev = inputs) read freed memory afterwards (a later call's data, then
/// garbage); now such a use raises, naming the fix.
struct inputs_handle {
  const cluster_inputs* in = nullptr;
  const cluster_inputs& get() const {
    if (!in)
      throw std::runtime_error(
          "inputs: used after the decision it was given to returned (it holds that decision's jobs only "
          "during the call); copy what you need during the call, e.g. self.prev = (inputs.now, inputs.jobs)");
    return *in;
  }
};

/// Python's KeyboardInterrupt or SystemExit raised inside a cluster policy, carried through the
/// simulator (cluster_policy_interrupted) and raised again as it was where the run was called.
struct python_interrupt : cluster_policy_interrupted {
  explicit python_interrupt(py::error_already_set e) : error(std::move(e)) {}
  py::error_already_set error;
};

/// A Python function as a cluster policy: called with the GIL held (the study runs without it),
/// its answer read as a list of integers (anything with __index__: NumPy's too; bools and floats
/// refused: a count is an integer); a Python error becomes a std::runtime_error here, while the
/// GIL is held, carrying Python's message (KeyboardInterrupt and SystemExit pass as they are).
cluster_policy_fn python_cluster_policy(const std::string& name, const py::function& fn) {
  // Dropped with the GIL when the registration goes; after the interpreter ended, left alone.
  std::shared_ptr<py::function> held(new py::function(fn), [](py::function* f) {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      delete f;
    }
  });
  return [held, name](const cluster_inputs& in) -> std::vector<int> {
    py::gil_scoped_acquire gil;
    auto handle = std::make_shared<inputs_handle>();
    handle->in = &in;
    struct expire {
      inputs_handle& h;
      ~expire() { h.in = nullptr; }
    } expire_after{*handle};
    try {
      const py::object out = (*held)(py::cast(handle));
      if (!py::isinstance<py::sequence>(out) || py::isinstance<py::str>(out))
        throw std::invalid_argument("counts: cluster policy '" + name + "' returned " +
                                    py::repr(out).cast<std::string>() +
                                    "; return a list of one device count (an int) per job of inputs.jobs");
      std::vector<int> counts;
      for (const auto& item : out.cast<py::sequence>()) {
        if (py::isinstance<py::bool_>(item) || !PyIndex_Check(item.ptr()))
          throw std::invalid_argument("counts: cluster policy '" + name + "' returned " +
                                      py::repr(item).cast<std::string>() +
                                      " among its counts; give each job an integer (an int, or NumPy's)");
        const py::int_ k = py::reinterpret_steal<py::int_>(PyNumber_Index(item.ptr()));
        if (!k) throw py::error_already_set();
        if (k < py::int_(-(1LL << 30)) || k > py::int_(1LL << 30))
          throw std::invalid_argument("counts: cluster policy '" + name + "' returned " +
                                      py::repr(item).cast<std::string>() +
                                      " devices for a job; give each job 0..its max_devices");
        counts.push_back(k.cast<int>());  // the range is checked by the simulator (arbitration.hpp)
      }
      return counts;
    } catch (py::error_already_set& e) {
      if (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) throw python_interrupt(std::move(e));
      throw std::runtime_error(e.what());  // converted while the GIL is held
    }
  };
}

}  // namespace

void dra::python::bind_sim(py::module_& m) {
  m.attr("version") = dra::version;
  m.attr("sim_in_place_resize_cost_stand_in_s") = in_place_resize_cost_stand_in_s;
  m.attr("sim_policy_names") = policy_names();
  m.attr("sim_study_baselines") = study_baselines();
  m.attr("sim_default_job_price_floor") = dra::policy::convergence_aware_config{}.price_floor;

  // The results, as dicts: each property is named after its key (None where a time or metric was
  // not reached), the timeline as columns.
  def_to_dict(py::class_<job_spec>(m, "SimJobSpec", "A job of a workload: arrival, application, request."))
      .def_readonly("name", &job_spec::name)
      .def_readonly("submit_s", &job_spec::submit_s)
      .def_readonly("application", &job_spec::application)
      .def_readonly("replicas", &job_spec::replicas)
      .def_readonly("batch", &job_spec::batch)
      .def_readonly("throughput_scale", &job_spec::throughput_scale)
      .def_readonly("gns_scale", &job_spec::gns_scale)
      .def_property_readonly("target_metric", finite_or_none(&job_spec::target_metric))
      .def_property_readonly("declared_epochs", finite_or_none(&job_spec::declared_epochs),
                             "Epochs the job declares (None: nothing).")
      .def_readonly("declared_from_file", &job_spec::declared_from_file)
      .def_readonly("stop_patience", &job_spec::stop_patience, "Truth: early-stopping patience (0: none).")
      .def_readonly("stop_min_delta", &job_spec::stop_min_delta)
      .def_readonly("gns_estimate_sigma", &job_spec::gns_estimate_sigma)
      .def_readonly("target_by_work", &job_spec::target_by_work);
  def_to_dict(py::class_<job_result>(m, "SimJobResult", "One job's outcome under one policy."))
      .def_readonly("name", &job_result::name)
      .def_readonly("application", &job_result::application)
      .def_readonly("submit_s", &job_result::submit_s)
      .def_property_readonly("start_s", finite_or_none(&job_result::start_s))
      .def_property_readonly("completion_s", finite_or_none(&job_result::completion_s))
      .def_property_readonly("jct_s", finite_or_none(&job_result::jct_s))
      .def_readonly("gpu_seconds", &job_result::gpu_seconds)
      .def_readonly("compute_gpu_seconds", &job_result::compute_gpu_seconds)
      .def_readonly("busy_gpu_seconds", &job_result::busy_gpu_seconds)
      .def_readonly("progress", &job_result::progress)
      .def_readonly("epochs", &job_result::epochs)
      .def_readonly("requested_replicas", &job_result::requested_replicas)
      .def_readonly("requested_batch", &job_result::requested_batch)
      .def_readonly("final_batch", &job_result::final_batch)
      .def_property_readonly("final_metric", finite_or_none(&job_result::final_metric))
      .def_readonly("reached_target", &job_result::reached_target)
      .def_readonly("reallocations", &job_result::reallocations)
      .def_readonly("max_devices", &job_result::max_devices)
      .def_readonly("mean_devices", &job_result::device_time_weighted_devices, "Mean devices while allocated.")
      .def_property_readonly("declared_epochs", finite_or_none(&job_result::declared_epochs))
      .def_readonly("stopped_early", &job_result::stopped_early)
      .def_readonly("estimate_checks", &job_result::estimate_checks,
                    "Remaining-work estimates at 10/50/90 % of its life: (life fraction, epochs done, true remaining "
                    "epochs, estimated median, tail).");
  def_to_dict(py::class_<timeline_point>(m, "SimTimelinePoint", "The cluster at one tick."))
      .def_readonly("time_s", &timeline_point::time_s)
      .def_readonly("allocated", &timeline_point::allocated)
      .def_readonly("running", &timeline_point::running)
      .def_readonly("waiting", &timeline_point::waiting)
      .def_readonly("compute_fraction", &timeline_point::compute_fraction)
      .def_readonly("busy_fraction", &timeline_point::busy_fraction);
  def_to_dict(py::class_<sim_result>(m, "SimResult", "A simulation's jobs, timeline and totals."))
      .def_readonly("policy", &sim_result::policy)
      .def_readonly("capacity", &sim_result::capacity)
      .def_readonly("reallocation_cost_s", &sim_result::reallocation_cost_s)
      .def_readonly("makespan_s", &sim_result::makespan_s)
      .def_readonly("first_submit_s", &sim_result::first_submit_s)
      .def_readonly("end_s", &sim_result::end_s)
      .def_readonly("wall_s", &sim_result::wall_s)
      .def_readonly("all_completed", &sim_result::all_completed)
      .def_readonly("jobs", &sim_result::jobs)
      .def_property_readonly(
          "timeline", [](const sim_result& r) { return columns(r.timeline); }, "The timeline as columns.");
  def_to_dict(py::class_<study_run>(m, "SimStudyRun", "One generated job under every policy and baseline."))
      .def_readonly("index", &study_run::index)
      .def_readonly("cluster", &study_run::cluster)
      .def_readonly("spec", &study_run::spec)
      .def_readonly("best_size_devices", &study_run::best_size_devices)
      .def_readonly("hindsight_devices", &study_run::hindsight_devices)
      .def_readonly("hindsight_batch", &study_run::hindsight_batch)
      .def_readonly("results", &study_run::results);

  def_to_dict(py::class_<application_profile>(m, "SimApplication", "An application's limits (SimProfiles.info)."))
      .def_property_readonly("init_batch", &application_profile::init_batch)
      .def_property_readonly("max_batch", &application_profile::max_batch)
      .def_property_readonly("min_local_batch", &application_profile::min_local_batch)
      .def_property_readonly("max_local_batch", &application_profile::max_local_batch)
      .def_property_readonly("max_epochs", &application_profile::max_epochs)
      .def_property_readonly("max_replicas", &application_profile::max_replicas)
      .def_property_readonly("metric_increases", &application_profile::metric_increases)
      .def_property_readonly("placement_noise", &application_profile::placement_noise)
      .def_property_readonly("gns_noise", &application_profile::gns_noise);
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
            return to_dict(py::cast(&lib.at(name), py::return_value_policy::reference));
          },
          py::arg("application"));

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (python_interrupt& e) {
      e.error.restore();  // the KeyboardInterrupt or SystemExit, raised where the run was called
    }
  });
  py::class_<inputs_handle, std::shared_ptr<inputs_handle>>(
      m, "ClusterInputs", "What a cluster policy is told at one decision; valid only during the call (raises after).")
      .def_property_readonly(
          "jobs",
          [](const inputs_handle& h) {
            py::list jobs;
            for (const job_view* v : h.get().jobs) jobs.append(view_dict(*v));
            return jobs;
          },
          "The jobs that arrived and are not done, in arrival order, as dicts of what a real scheduler knows.")
      .def_property_readonly(
          "capacity", [](const inputs_handle& h) { return h.get().capacity; }, "Devices in the cluster.")
      .def_property_readonly("nodes", [](const inputs_handle& h) { return h.get().nodes; })
      .def_property_readonly("devices_per_node", [](const inputs_handle& h) { return h.get().devices_per_node; })
      .def_property_readonly(
          "now", [](const inputs_handle& h) { return h.get().now; }, "Simulated seconds.")
      .def(
          "goodput",
          [](const inputs_handle& h, long long i, int k) {
            const cluster_inputs& in = h.get();
            if (i < 0)
              dra::detail::throw_invalid("i", "goodput asked about job " + std::to_string(i) + " of " +
                                                  std::to_string(in.jobs.size()) + "; use an index of inputs.jobs");
            return in.goodput(static_cast<std::size_t>(i), k);
          },
          py::arg("i"), py::arg("k"),
          "Predicted best goodput of jobs[i] at k devices, from its online-fitted model (0 before it measured).");
  m.def(
      "sim_add_cluster_policy",
      [](const std::string& name, const py::function& decide, const std::string& summary, bool in_place) {
        add_cluster_policy(name, python_cluster_policy(name, decide), summary, in_place);
      },
      py::arg("name"), py::arg("decide"), py::arg("summary") = "", py::arg("in_place") = false,
      "Registers a Python function decide(inputs) -> [device count per job] as a simulator cluster policy.");
  m.def("sim_remove_cluster_policy", &remove_cluster_policy, py::arg("name"),
        "Removes a policy added with sim_add_cluster_policy (built-in ones stay).");

  m.def(
      "sim_read_workload",
      [](const std::string& path, const profile_library* profiles) { return list_of(read_workload(path, profiles)); },
      py::arg("path"), py::arg("profiles") = nullptr,
      "Reads a workload CSV (name,time,application,num_replicas,batch_size) into job dicts; errors name file, line, "
      "column.");

  m.def(
      "sim_run",
      [](const profile_library& profiles, const py::list& jobs, const std::string& policy, double reallocation_cost_s,
         double interval_s, int nodes, int devices_per_node, double quota_scale, bool record_timeline,
         double declared_sigma, double declared_none_share, double early_stop_share, std::uint64_t declaration_seed,
         const std::function<bool(double, std::size_t, std::size_t)>& progress, double launch_cost_s) {
        std::vector<job_spec> specs;
        for (auto o : jobs) specs.push_back(spec_from(o));
        declaration_config d;
        d.sigma = declared_sigma;
        d.none_share = declared_none_share;
        d.early_stop_share = early_stop_share;
        d.seed = declaration_seed;
        declare_budgets(specs, profiles, d);
        sim_config c;
        c.policy = policy;
        c.reallocation_cost_s = reallocation_cost_s;
        c.launch_cost_s = launch_cost_s;
        c.interval_s = interval_s;
        c.nodes = nodes;
        c.devices_per_node = devices_per_node;
        c.quota_scale = quota_scale;
        c.record_timeline = record_timeline;
        return dict_of(simulate(profiles, specs, c, progress));
      },
      py::arg("profiles"), py::arg("jobs"), py::arg("policy"), py::arg("reallocation_cost_s") = 30.0,
      py::arg("interval_s") = 60.0, py::arg("nodes") = 16, py::arg("devices_per_node") = 4,
      py::arg("quota_scale") = 0.0, py::arg("record_timeline") = true, py::arg("declared_sigma") = 0.0,
      py::arg("declared_none_share") = 0.0, py::arg("early_stop_share") = 0.0, py::arg("declaration_seed") = 1,
      py::arg("progress") = nullptr, py::arg("launch_cost_s") = -1.0,
      "Simulates jobs (dicts as from sim_read_workload) on a cluster under one policy; returns a result dict. Each "
      "job's first start costs launch_cost_s (< 0: reallocation_cost_s, as every later change). Jobs "
      "declare their epoch budget with log-normal error declared_sigma (a file's declared_epochs column is kept), a "
      "share declares nothing, a share stops early on a plateau (declare_budgets).");

  m.def(
      "sim_study",
      [](const profile_library& profiles, const py::list& pool, int runs, std::uint64_t seed,
         const std::vector<std::string>& policies, double reallocation_cost_s, double quota_scale, double interval_s,
         bool noise, bool reference_limits, bool perturb, bool shared_cluster, int jobs_per_cluster, bool hindsight,
         double price_floor, double declared_sigma, double declared_none_share, double gns_estimate_sigma,
         bool target_by_work, bool compare_target_rules, const std::function<void(int, int)>& progress) {
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
        c.hindsight = hindsight;
        c.declared_sigma = declared_sigma;
        c.declared_none_share = declared_none_share;
        c.gns_estimate_sigma = gns_estimate_sigma;
        c.target_by_work = target_by_work;
        c.compare_target_rules = compare_target_rules;
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
        return list_of(rows);
      },
      py::arg("profiles"), py::arg("pool"), py::arg("runs"), py::arg("seed"), py::arg("policies"),
      py::arg("reallocation_cost_s") = in_place_resize_cost_stand_in_s, py::arg("quota_scale") = 1.0,
      py::arg("interval_s") = 60.0, py::arg("noise") = true, py::arg("reference_limits") = false,
      py::arg("perturb") = false, py::arg("shared_cluster") = false, py::arg("jobs_per_cluster") = 160,
      py::arg("hindsight") = true, py::arg("price_floor") = dra::policy::convergence_aware_config{}.price_floor,
      py::arg("declared_sigma") = 0.0, py::arg("declared_none_share") = 0.0,
      py::arg("gns_estimate_sigma") = study_config{}.gns_estimate_sigma, py::arg("target_by_work") = true,
      py::arg("compare_target_rules") = true, py::arg("progress") = nullptr,
      "Generates `runs` jobs from the request pool (seeded) and simulates each under the static baselines and every "
      "dynamic policy, alone or (shared_cluster) in groups contending for one cluster.");
}
