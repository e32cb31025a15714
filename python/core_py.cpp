#include <pybind11/pybind11.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "bindings.hpp"
#include "dra/error.hpp"

namespace py = pybind11;

namespace {
// SIGTERM in a process that asked the job to stop on it (dra._process.stop_on_sigterm): Python's
// own C handler in that process, the default action in any process forked from it. A forked child
// inherits the handler, and one that never reaches Python again (stuck in an at-fork hook, in C)
// could not run the Python handler: SIGTERM would not end it. Decided at the signal, by pid, so no
// fork needs the handler changed (a SIGTERM during a DataLoader's fork stops the job cleanly).
struct sigaction python_sigterm{};
pid_t sigterm_owner = 0;
volatile sig_atomic_t sigterms_seen = 0;  // in the owner: a second SIGTERM ends it at once

void sigterm_by_pid(int sig, siginfo_t* info, void* context) {
  // A forked child takes the default action; so does the owner at its second SIGTERM, which
  // Python could not tell from the first while its main thread is in C (it runs the handler once).
  if (getpid() != sigterm_owner || ++sigterms_seen >= 2) {
    signal(sig, SIG_DFL);  // async-signal-safe; the raise is delivered when this handler returns
    raise(sig);
    return;
  }
  if (python_sigterm.sa_flags & SA_SIGINFO) {
    python_sigterm.sa_sigaction(sig, info, context);
  } else if (python_sigterm.sa_handler != SIG_DFL && python_sigterm.sa_handler != SIG_IGN) {
    python_sigterm.sa_handler(sig);
  }
}
}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "dra's compiled core: signals, policies, the decision engine, the controller (the simulator is dra._sim).";
  // dra::timeout_error must reach Python as TimeoutError; the rest of the hierarchy keeps its name.
  static py::exception<dra::error> error_type(m, "DraError", PyExc_RuntimeError);
  error_type.doc() = "Base of every runtime failure raised by dra itself (a RuntimeError).";
  py::register_exception<dra::comm_error>(m, "CommError", error_type.ptr());
  py::register_exception<dra::membership_error>(m, "MembershipError", error_type.ptr());
  py::register_exception<dra::state_mismatch_error>(m, "StateMismatchError", error_type.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dra::timeout_error& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    }
  });
  dra::python::bind_signals(m);
  dra::python::bind_policy(m);
  dra::python::bind_registry(m);
  dra::python::bind_build(m);
  dra::python::bind_elastic(m);  // before the controller: its signature names these types
  dra::python::bind_controller(m);
  dra::python::bind_step(m);
  dra::python::bind_comm(m);
  dra::python::bind_rl(m);
  dra::python::bind_testing(m);
  dra::python::bind_energy(m);
  dra::python::bind_compress(m);
  dra::python::bind_pool(m);
  m.def(
      "_sigterm_ends_forked_children",
      [] {
        struct sigaction current{};
        if (sigaction(SIGTERM, nullptr, &current) != 0)
          throw std::system_error(errno, std::generic_category(), "sigaction");
        sigterm_owner = getpid();
        sigterms_seen = 0;
        if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == &sigterm_by_pid) return;  // already
        python_sigterm = current;
        struct sigaction mine = current;
        mine.sa_sigaction = &sigterm_by_pid;
        mine.sa_flags = current.sa_flags | SA_SIGINFO;
        if (sigaction(SIGTERM, &mine, nullptr) != 0)
          throw std::system_error(errno, std::generic_category(), "sigaction");
      },
      "Called right after signal.signal(SIGTERM, handler): that handler runs in this process, and a process "
      "forked from it ends at SIGTERM (the default action), whatever it is doing.");
}
