// Python access to the NCCL backend: the loaded library's version, and an NcclWorld that drives
// dra::comm::nccl_backend (rebuild + collectives) for the GPU tests and benchmarks. torch's own
// c10d Store type comes from another pybind11 build, so the store is created here from a host
// and port (a client of torchrun's TCPStore works) or is an in-process HashStore.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"

#ifdef DRA_WITH_NCCL
#include <torch/csrc/utils/pybind.h>

#include <mutex>
#include <optional>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dra/error.hpp"
#include "dra/torch/comm/nccl.hpp"
#endif

namespace py = pybind11;

#ifdef DRA_WITH_NCCL
namespace {
using namespace dra::comm;

std::chrono::milliseconds to_ms(double seconds, const char* field) {
  if (!(seconds > 0.0)) throw std::invalid_argument(std::string(field) + ": must be a positive number of seconds");
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0 + 0.5));
}

/// One process's NCCL world: a backend, the store, and the communicator of the current epoch.
class nccl_world {
 public:
  nccl_world(int device, const std::string& store_host, int store_port, bool store_server, int store_workers,
             double timeout_s, const std::string& prefix, bool capture_log)
      : timeout_(to_ms(timeout_s, "timeout_s")) {
    if (device < -1)
      throw std::invalid_argument(
          "device: must be a CUDA device index >= 0, or -1 for the emulated library (CPU "
          "tensors, DRA_NCCL_EMULATION=1)");
    if (store_host.empty()) {
      store_ = c10::make_intrusive<c10d::HashStore>();
    } else {
      if (store_port <= 0 || store_port > 65535) throw std::invalid_argument("store_port: must be in 1..65535");
      c10d::TCPStoreOptions opts;
      opts.port = static_cast<std::uint16_t>(store_port);
      opts.isServer = store_server;
      if (store_workers > 0) opts.numWorkers = static_cast<std::size_t>(store_workers);
      opts.waitWorkers = false;
      opts.timeout = timeout_;
      py::gil_scoped_release release;
      store_ = c10::make_intrusive<c10d::TCPStore>(store_host, opts);
    }
    nccl_backend_options options;
    options.device = device;
    options.key_prefix = prefix;
    if (capture_log) {
      options.log = [this](const std::string& line) {
        std::lock_guard<std::mutex> lock(log_mutex_);
        log_.push_back(line);
      };
    }
    auto api = load_nccl_api();
    if (device < 0 && !api->host_memory())
      throw std::invalid_argument(
          "device: -1 needs the emulated library (DRA_NCCL_EMULATION=1); give the CUDA device "
          "index for the real NCCL");
    backend_ = std::make_unique<nccl_backend>(std::move(api), options);
  }

  std::string rebuild(std::uint64_t epoch, std::vector<int> old_members, std::vector<int> new_members, int self,
                      bool abortive, std::optional<double> timeout_s, std::optional<double> collective_timeout_s) {
    rebuild_request req;
    req.epoch = epoch;
    req.old_members = std::move(old_members);
    req.new_members = std::move(new_members);
    req.self = self;
    req.abortive = abortive;
    req.timeout = timeout_s ? to_ms(*timeout_s, "timeout_s") : timeout_;
    if (collective_timeout_s) req.collective_timeout = to_ms(*collective_timeout_s, "collective_timeout_s");
    {
      py::gil_scoped_release release;
      comm_ = backend_->rebuild(std::move(comm_), req, store_);
    }
    return to_string(backend_->last_path());
  }

  communicator& comm() {
    if (!comm_) throw dra::comm_error("NcclWorld: no communicator (not built yet, aborted, or this rank left)");
    return *comm_;
  }

  void all_reduce_sum(at::Tensor& t) {
    py::gil_scoped_release release;
    comm().all_reduce_sum(t);
  }
  void broadcast(at::Tensor& t, int root) {
    py::gil_scoped_release release;
    comm().broadcast(t, root);
  }
  void barrier() {
    py::gil_scoped_release release;
    comm().barrier();
  }
  // Point-to-point as the state handoff uses it: one plain send/recv of a tensor, and the
  // handoff's chunked transfer (backend::make_transfer) of a list of tensors. Both return once the
  // bytes arrived: the transfer waits itself; a plain send/recv then waits for the communicator's
  // work (bounded by its timeout).
  void send(const at::Tensor& t, std::vector<int> dsts) {
    py::gil_scoped_release release;
    comm().send(t, dsts, 0);
    wait();
  }
  void recv(at::Tensor& t, int src) {
    py::gil_scoped_release release;
    comm().recv(t, src, 0);
    wait();
  }
  void transfer_send(const std::vector<at::Tensor>& tensors, std::vector<int> dsts, double chunk_mb) {
    auto transfer = make_transfer(chunk_mb);
    py::gil_scoped_release release;
    transfer->send(comm(), tensors, dsts);
  }
  void transfer_recv(const std::vector<at::Tensor>& tensors, int src, double chunk_mb) {
    auto transfer = make_transfer(chunk_mb);
    py::gil_scoped_release release;
    transfer->recv(comm(), tensors, src);
  }
  void abort() {
    if (comm_) comm_->abort();
  }
  void close() {
    py::gil_scoped_release release;
    comm_.reset();  // finalize -> destroy, abort on failure
  }
  bool active() const {
    const auto* c = dynamic_cast<const nccl_communicator*>(comm_.get());
    return c && c->handle() && !c->revoked();
  }
  int rank() const { return comm_ ? comm_->rank() : -1; }
  int size() const { return comm_ ? comm_->size() : 0; }
  std::uint64_t epoch() const { return comm_ ? comm_->epoch() : 0; }
  py::dict last_plan() const {
    const auto& p = backend_->last_plan();
    py::dict d;
    d["planned"] = to_string(p.path);
    d["taken"] = to_string(backend_->last_path());
    d["reason"] = p.reason;
    d["abortive"] = p.abortive;
    d["old_rank"] = p.old_rank;
    d["new_rank"] = p.new_rank;
    d["new_size"] = p.new_size;
    d["exclude_ranks"] = p.exclude_ranks;
    return d;
  }
  std::vector<std::string> log() const {
    std::lock_guard<std::mutex> lock(log_mutex_);
    return log_;
  }
  std::string runtime_version() const { return nccl_version_string(backend_->api().features().runtime_version); }
  bool emulated() const { return backend_->api().host_memory(); }

 private:
  std::unique_ptr<tensor_transfer> make_transfer(double chunk_mb) const {
    if (!(chunk_mb > 0.0)) throw std::invalid_argument("chunk_mb: must be a positive number of MiB");
    return backend_->make_transfer(static_cast<std::size_t>(chunk_mb * 1024.0 * 1024.0));
  }
  void wait() {
    if (auto* c = dynamic_cast<nccl_communicator*>(comm_.get())) c->synchronize();
  }

  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<nccl_backend> backend_;
  std::unique_ptr<communicator> comm_;
  mutable std::mutex log_mutex_;
  std::vector<std::string> log_;
};
}  // namespace
#endif

void dra::python::bind_nccl(py::module_& m) {
#ifdef DRA_WITH_NCCL
  m.attr("nccl_compiled") = true;
  m.def(
      "nccl_runtime_version",
      []() -> py::object {
        const int v = dra::comm::nccl_runtime_version();
        return v > 0 ? py::object(py::str(dra::comm::nccl_version_string(v))) : py::object(py::none());
      },
      "Version of the libnccl the NCCL backend loads (dlopen on first use), or None when none loads.");
  m.def("nccl_load_error", &dra::comm::nccl_load_error, "Why libnccl could not be loaded ('' when it loaded).");
#else
  m.attr("nccl_compiled") = false;
#endif
}

void dra::python::bind_nccl_testing(py::module_& m) {
#ifdef DRA_WITH_NCCL
  py::class_<nccl_world>(m, "NcclWorld",
                         "One process's NCCL world (dra's NCCL backend): rebuild() builds the communicator of an "
                         "epoch; collectives run on the tensor's current CUDA stream.")
      .def(py::init<int, const std::string&, int, bool, int, double, const std::string&, bool>(), py::arg("device"),
           py::arg("store_host") = "", py::arg("store_port") = 0, py::arg("store_server") = false,
           py::arg("store_workers") = 0, py::arg("timeout_s") = 60.0, py::arg("prefix") = "dra/nccl",
           py::arg("capture_log") = false)
      .def("rebuild", &nccl_world::rebuild, py::arg("epoch"), py::arg("old_members"), py::arg("new_members"),
           py::arg("self_id"), py::arg("abortive") = false, py::arg("timeout_s") = py::none(),
           py::arg("collective_timeout_s") = py::none(),
           "Builds the communicator of `new_members` for `epoch`; returns the path taken "
           "('fresh_init', 'shrink', 'grow', 'keep' or 'leave'). `collective_timeout_s` bounds every "
           "operation afterwards (the watchdog's timeout; default: the rendezvous timeout).")
      .def("all_reduce_sum", &nccl_world::all_reduce_sum, py::arg("tensor"))
      .def("broadcast", &nccl_world::broadcast, py::arg("tensor"), py::arg("root"))
      .def("barrier", &nccl_world::barrier)
      .def("send", &nccl_world::send, py::arg("tensor"), py::arg("dsts"),
           "Plain point-to-point: one ncclSend per destination in one group; returns when it completed.")
      .def("recv", &nccl_world::recv, py::arg("tensor"), py::arg("src"))
      .def("transfer_send", &nccl_world::transfer_send, py::arg("tensors"), py::arg("dsts"), py::arg("chunk_mb") = 16.0,
           "The state handoff's transfer (chunked, pipelined on its own stream) of `tensors` to `dsts`.")
      .def("transfer_recv", &nccl_world::transfer_recv, py::arg("tensors"), py::arg("src"), py::arg("chunk_mb") = 16.0)
      .def("abort", &nccl_world::abort, "Abandons in-flight work (ncclCommAbort); never blocks.")
      .def("close", &nccl_world::close, "Releases the communicator: finalize -> destroy, abort on failure.")
      .def_property_readonly("active", &nccl_world::active)
      .def_property_readonly("rank", &nccl_world::rank)
      .def_property_readonly("size", &nccl_world::size)
      .def_property_readonly("epoch", &nccl_world::epoch)
      .def_property_readonly("last_plan", &nccl_world::last_plan)
      .def_property_readonly("log", &nccl_world::log)
      .def_property_readonly("runtime_version", &nccl_world::runtime_version)
      .def_property_readonly("emulated", &nccl_world::emulated, "Whether this is the emulated library (CPU tensors).");
#else
  (void)m;
#endif
}
