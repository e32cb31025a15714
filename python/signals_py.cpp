#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "dra/signals/convergence_estimator.hpp"
#include "dra/signals/remaining_work.hpp"
#include "kwargs_init.hpp"
#include "to_dict.hpp"

namespace py = pybind11;
using namespace dra::signals;

void dra::python::bind_signals(py::module_& m) {
  py::class_<estimator_config> config(m, "EstimatorConfig", "Settings of the convergence-signal estimator.");
  def_kwargs_init<estimator_config>(config);
  config.def_readwrite("loss_decay", &estimator_config::loss_decay, "EMA decay of the smoothed loss, in [0, 1).")
      .def_readwrite("window", &estimator_config::window, "Steps in the least-squares window of the progress rate.")
      .def_readwrite("warmup_steps", &estimator_config::warmup_steps, "Updates reported as warm-up.")
      .def_readwrite("plateau_relative_improvement", &estimator_config::plateau_relative_improvement,
                     "A window improving log-loss by less than this fraction counts as flat.")
      .def_readwrite("plateau_t_threshold", &estimator_config::plateau_t_threshold,
                     "A slope not below -t * stderr counts as flat.")
      .def_readwrite("plateau_patience", &estimator_config::plateau_patience, "Flat updates in a row before plateau.")
      .def_readwrite("plateau_exit_t_threshold", &estimator_config::plateau_exit_t_threshold,
                     "Once on a plateau, it clears only when the slope is below -t * stderr (stricter than entry).")
      .def_readwrite("fast_relative_improvement", &estimator_config::fast_relative_improvement,
                     "Improvement per window at or above which learning is 'fast'.")
      .def_readwrite("divergence_factor", &estimator_config::divergence_factor,
                     "Smoothed loss above this multiple of the best means diverging.")
      .def_readwrite("divergence_nonfinite_streak", &estimator_config::divergence_nonfinite_streak,
                     "Non-finite losses in a row that mean diverging.")
      .def_readwrite("outlier_factor", &estimator_config::outlier_factor,
                     "A loss above this multiple of the smoothed loss enters the state clipped to it (robust update).")
      .def_readwrite("spike_sigma", &estimator_config::spike_sigma,
                     "A log-loss more than this many residual deviations (at least spike_floor) above the fitted "
                     "trend enters the regression clipped to that bound (0: off).")
      .def_readwrite("spike_floor", &estimator_config::spike_floor,
                     "The least residual deviation (log-loss) the spike guard measures jumps against.")
      .def_readwrite("gns_decay", &estimator_config::gns_decay, "EMA decay of the gradient-noise-scale moments.")
      .def_readwrite("plateau_history_fraction", &estimator_config::plateau_history_fraction,
                     "Plateau also needs the loss to have improved by less than plateau_history_improvement since "
                     "this fraction of the current step (default 0.25; 0: off, the windowed test alone).")
      .def_readwrite("plateau_history_improvement", &estimator_config::plateau_history_improvement,
                     "Relative improvement since plateau_history_fraction x step below which learning has stalled.")
      .def("validate", &estimator_config::validate);

  def_to_dict(
      py::class_<convergence_signals>(m, "ConvergenceSignals", "What the estimator knows after its latest update."))
      .def_readonly("step", &convergence_signals::step)
      .def_readonly("accepted", &convergence_signals::accepted)
      .def_readonly("loss", &convergence_signals::loss)
      .def_readonly("smoothed_loss", &convergence_signals::smoothed_loss)
      .def_readonly("best_loss", &convergence_signals::best_loss)
      .def_readonly("best_smoothed_loss", &convergence_signals::best_smoothed_loss)
      .def_readonly("progress_rate", &convergence_signals::progress_rate, "Slope of log(loss) per step.")
      .def_readonly("progress_rate_stderr", &convergence_signals::progress_rate_stderr)
      .def_readonly("relative_improvement", &convergence_signals::relative_improvement)
      .def_readonly("noise", &convergence_signals::noise)
      .def_readonly("plateau", &convergence_signals::plateau)
      .def_readonly("diverging", &convergence_signals::diverging)
      .def_readonly("flat_streak", &convergence_signals::flat_streak)
      .def_property_readonly("phase", [](const convergence_signals& s) { return to_string(s.phase); })
      .def_readonly("gns_valid", &convergence_signals::gns_valid)
      .def_readonly("gns_biased", &convergence_signals::gns_biased)
      .def_readonly("gns", &convergence_signals::gns, "Gradient noise scale B_simple = tr(Sigma)/|G|^2, in samples.")
      .def_readonly("grad_sqr", &convergence_signals::grad_sqr)
      .def_readonly("grad_var", &convergence_signals::grad_var)
      .def_readonly("has_validation", &convergence_signals::has_validation)
      .def_readonly("validation_metric", &convergence_signals::validation_metric)
      .def_readonly("nonfinite_count", &convergence_signals::nonfinite_count)
      .def_readonly("nonfinite_streak", &convergence_signals::nonfinite_streak)
      .def_readonly("nonpositive_count", &convergence_signals::nonpositive_count)
      .def_readonly("outlier_count", &convergence_signals::outlier_count,
                    "Losses clipped to outlier_factor x the smoothed loss by the robust update.")
      .def_readonly("spike_count", &convergence_signals::spike_count,
                    "Log-losses clipped to the trend's spike bound (spike_sigma) before the regression.")
      .def("__repr__", [](const convergence_signals& s) {
        return "<ConvergenceSignals step=" + std::to_string(s.step) + " phase=" + to_string(s.phase) +
               " smoothed_loss=" + std::to_string(s.smoothed_loss) + ">";
      });

  py::class_<convergence_estimator>(m, "ConvergenceEstimator",
                                    "Streaming convergence-signal estimator: O(1), allocation-free per update.")
      .def(py::init<estimator_config>(), py::arg_v("config", estimator_config{}, "EstimatorConfig()"))
      .def("update_loss", &convergence_estimator::update_loss, py::arg("step"), py::arg("loss"),
           "Feed the loss of `step`; returns False when the value was rejected (non-finite or step not increasing).")
      .def("update_gradients", &convergence_estimator::update_gradients, py::arg("small_sqr_norm"),
           py::arg("small_batch"), py::arg("big_sqr_norm"), py::arg("big_batch"), py::arg("biased") = false,
           "Two-batch-size gradient square norms of one step (per-rank mean and all-reduced).")
      .def("update_validation", &convergence_estimator::update_validation, py::arg("metric"))
      .def_property_readonly("signals", &convergence_estimator::signals, py::return_value_policy::reference_internal)
      .def_property_readonly("config", &convergence_estimator::config, py::return_value_policy::reference_internal)
      .def_property_readonly("rejected_steps", &convergence_estimator::rejected_steps);

  // Issue 21: the remaining-work estimator (the simulator's, the engine's and the pool's).
  py::class_<remaining_work_config> rcfg(m, "RemainingWorkConfig", "Settings of the remaining-work estimator.");
  def_kwargs_init<remaining_work_config>(rcfg);
  rcfg.def_readwrite("declared_sigma", &remaining_work_config::declared_sigma)
      .def_readwrite("curve_sigma", &remaining_work_config::curve_sigma)
      .def_readwrite("uninformed_sigma", &remaining_work_config::uninformed_sigma)
      .def_readwrite("prior_count", &remaining_work_config::prior_count)
      .def_readwrite("min_class_jobs", &remaining_work_config::min_class_jobs)
      .def_readwrite("min_curve_points", &remaining_work_config::min_curve_points)
      .def_readwrite("min_sigma", &remaining_work_config::min_sigma)
      .def_readwrite("tail_quantile", &remaining_work_config::tail_quantile)
      .def("validate", &remaining_work_config::validate);
  def_to_dict(
      py::class_<work_estimate>(m, "WorkEstimate", "Remaining work as a distribution (the unit of the observations)."))
      .def_readonly("median", &work_estimate::median)
      .def_readonly("mean", &work_estimate::mean)
      .def_readonly("tail", &work_estimate::tail, "At the configured tail quantile (p90).")
      .def_readonly("total_log_mu", &work_estimate::total_log_mu)
      .def_readonly("total_log_sigma", &work_estimate::total_log_sigma)
      .def_property_readonly("sources", [](const work_estimate& e) { return describe_sources(e.sources); })
      .def_readonly(
          "cap_log", &work_estimate::cap_log,
          "Log of the class's longest finished total, or of the declaration if larger (inf: no class history).")
      .def_readonly("beyond_cap", &work_estimate::beyond_cap,
                    "At most this chance that the total runs past the cap (1 / (k + 1); 1: no cap).")
      .def("__repr__", [](const work_estimate& e) {
        return "<WorkEstimate median=" + std::to_string(e.median) + " tail=" + std::to_string(e.tail) +
               " sources=" + describe_sources(e.sources) + ">";
      });
  auto observation = [](const std::string& job_class, double declared, double done,
                        const std::vector<std::pair<double, double>>& curve) {
    work_observation o;
    o.job_class = job_class;
    o.declared = declared > 0.0 ? declared : std::nan("");
    o.done = done;
    o.curve = curve;
    return o;
  };
  py::class_<remaining_work_estimator>(m, "RemainingWorkEstimator",
                                       "Remaining work from a declaration, progress, the loss curve and finished jobs "
                                       "of the same class (include/dra/signals/remaining_work.hpp).")
      .def(py::init<remaining_work_config>(), py::arg_v("config", remaining_work_config{}, "RemainingWorkConfig()"))
      .def(
          "estimate",
          [observation](const remaining_work_estimator& e, const std::string& job_class, double done, double declared,
                        const std::vector<std::pair<double, double>>& curve) {
            return e.estimate(observation(job_class, declared, done, curve));
          },
          py::arg("job_class"), py::arg("done"), py::arg("declared") = 0.0,
          py::arg("curve") = std::vector<std::pair<double, double>>{},
          "Remaining work of a job that did `done` units, declared `declared` (0: nothing), with its loss curve "
          "[(done, loss), ...].")
      .def(
          "record_completion",
          [observation](remaining_work_estimator& e, const std::string& job_class, double total, double declared,
                        const std::vector<std::pair<double, double>>& curve) {
            e.record_completion(observation(job_class, declared, total, curve), total);
          },
          py::arg("job_class"), py::arg("total"), py::arg("declared") = 0.0,
          py::arg("curve") = std::vector<std::pair<double, double>>{},
          "A job of this class finished after `total` units: it calibrates the sources for later jobs.")
      .def("completed", py::overload_cast<>(&remaining_work_estimator::completed, py::const_))
      .def_property_readonly("config", &remaining_work_estimator::config, py::return_value_policy::reference_internal);
  m.def(
      "gittins_size", [](const work_estimate& e, double done) { return gittins_size(e, done); }, py::arg("estimate"),
      py::arg("done"),
      "The size a job counts as when ranked shortest-first under uncertainty (1 / its Gittins index).");
}
