// dra._sim: the cluster simulator and its policies as a module of their own, built from dra::core
// and dra::sim only (no torch), so `dra-sim` and `import dra.sim` start without loading torch.
#include <pybind11/pybind11.h>

#include "bindings.hpp"

PYBIND11_MODULE(_sim, m) {
  m.doc() = "dra's cluster simulator (torch-free): profiles, workloads, replays, the study, the policy registry.";
  dra::python::bind_sim(m);
  dra::python::bind_registry(m);
}
