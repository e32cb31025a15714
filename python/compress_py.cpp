// Bindings of the gradient codecs on numpy float32 arrays through a collective
// written in Python (torch.distributed in a job), and the dynamic-sparsification rules.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "dra/compress/codecs.hpp"
#include "dra/compress/sparsity.hpp"

namespace py = pybind11;
using namespace dra::compress;

namespace {

// A collective implemented by a Python object with world_size (int), allreduce_sum(ndarray) that
// sums in place over the world, and allgather(bytes) -> bytes (world_size x len, rank order).
class py_collective final : public collective {
 public:
  explicit py_collective(py::object impl) : impl_(std::move(impl)) {
    world_ = impl_.attr("world_size").cast<int>();
    if (world_ < 1) dra::detail::throw_invalid("world_size", "must be >= 1, got " + std::to_string(world_));
  }
  int world_size() const override { return world_; }
  void allreduce_sum(float* data, std::size_t n) override {
    py::array_t<float> view({static_cast<py::ssize_t>(n)}, {static_cast<py::ssize_t>(sizeof(float))}, data, py::none());
    impl_.attr("allreduce_sum")(view);
  }
  void allgather(const void* in, std::size_t bytes, void* out) override {
    py::bytes mine(static_cast<const char*>(in), bytes);
    const std::string all = impl_.attr("allgather")(mine).cast<std::string>();
    if (all.size() != bytes * static_cast<std::size_t>(world_))
      throw dra::comm_error("allgather returned " + std::to_string(all.size()) + " bytes, expected " +
                            std::to_string(bytes * static_cast<std::size_t>(world_)));
    std::memcpy(out, all.data(), all.size());
  }

 private:
  py::object impl_;
  int world_ = 1;
};

std::vector<tensor_ref> refs(const std::vector<py::array>& arrays) {
  std::vector<tensor_ref> out;
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const auto& a = arrays[i];
    if (!py::isinstance<py::array_t<float>>(a) || a.dtype().kind() != 'f' || a.itemsize() != 4)
      dra::detail::throw_invalid(
          "grads", "tensor " + std::to_string(i) + " is not float32; pass float32 arrays (tensor.numpy())");
    if (!(a.flags() & py::array::c_style))
      dra::detail::throw_invalid("grads", "tensor " + std::to_string(i) + " is not C-contiguous");
    if (!a.writeable()) dra::detail::throw_invalid("grads", "tensor " + std::to_string(i) + " is read-only");
    tensor_ref r;
    r.data = static_cast<float*>(const_cast<void*>(a.data()));
    for (py::ssize_t d = 0; d < a.ndim(); ++d) r.shape.push_back(a.shape(d));
    if (r.shape.empty()) r.shape.push_back(1);
    out.push_back(std::move(r));
  }
  return out;
}

dra::signals::training_phase phase_from(const std::string& name) {
  using dra::signals::training_phase;
  for (auto p : {training_phase::warmup, training_phase::fast, training_phase::steady, training_phase::plateau,
                 training_phase::diverging})
    if (name == dra::signals::to_string(p)) return p;
  dra::detail::throw_invalid("phase", "unknown phase '" + name + "'; use warmup, fast, steady, plateau or diverging");
}

}  // namespace

namespace dra::python {

void bind_compress(py::module_& m) {
  py::class_<gradient_codec>(
      m, "GradientCodec",
      "A gradient compression codec (make one with make_codec). reduce() turns a list of float32 "
      "arrays into their (approximate) mean over the world, in place.")
      .def_property_readonly("name", &gradient_codec::name)
      .def(
          "reduce",
          [](gradient_codec& c, const std::vector<py::array>& grads, py::object world) {
            auto r = refs(grads);
            py_collective coll(std::move(world));
            c.reduce(r, coll);
          },
          py::arg("grads"), py::arg("world"))
      .def_property_readonly(
          "bytes_sent", [](const gradient_codec& c) { return c.bytes().sent; },
          "Bytes this rank handed to the collective (payload, before the transport's own framing).")
      .def_property_readonly(
          "bytes_dense", [](const gradient_codec& c) { return c.bytes().dense; },
          "Bytes an fp32 all-reduce of the same tensors would have handed over.")
      .def("reset_bytes", &gradient_codec::reset_bytes)
      .def_property_readonly("steps", &gradient_codec::steps)
      .def(
          "save_state",
          [](const gradient_codec& c, bool with_error_feedback) {
            const auto b = c.save_state(with_error_feedback);
            return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
          },
          py::arg("with_error_feedback") = true,
          "State as bytes; without error feedback: only what every rank shares (what joiners receive).")
      .def("load_state",
           [](gradient_codec& c, const py::bytes& b) {
             const std::string s = b;
             c.load_state(std::vector<std::uint8_t>(s.begin(), s.end()));
           })
      .def("clear_error_feedback", &gradient_codec::clear_error_feedback)
      .def("set_masks",
           [](gradient_codec& c,
              const std::vector<py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>>& masks) {
             auto* mc = dynamic_cast<masked_codec*>(&c);
             if (!mc)
               dra::detail::throw_invalid("codec", "set_masks needs the 'masked' codec, this is '" + c.name() + "'");
             std::vector<std::vector<std::uint8_t>> v;
             for (const auto& a : masks) v.emplace_back(a.data(), a.data() + a.size());
             mc->set_masks(std::move(v));
           })
      .def("set_rank",
           [](gradient_codec& c, int rank) {
             auto* p = dynamic_cast<powersgd_codec*>(&c);
             if (!p)
               dra::detail::throw_invalid("codec", "set_rank needs the 'powersgd' codec, this is '" + c.name() + "'");
             p->set_rank(rank);
           })
      .def_property_readonly("rank", [](const gradient_codec& c) {
        auto* p = dynamic_cast<const powersgd_codec*>(&c);
        return p ? p->rank() : 0;
      });

  m.def("make_codec", &make_codec, py::arg("spec"), py::arg("seed") = 0,
        "fp32, fp16, bf16, powersgd:<rank>, topk:<fraction>, random:<keep fraction>, masked.");

  m.def(
      "rigl_update",
      [](py::array_t<std::uint8_t, py::array::c_style> mask,
         py::array_t<float, py::array::c_style | py::array::forcecast> weights,
         py::array_t<float, py::array::c_style | py::array::forcecast> grads, double sparsity, double update_fraction) {
        const auto n = static_cast<std::size_t>(weights.size());
        if (static_cast<std::size_t>(grads.size()) != n || static_cast<std::size_t>(mask.size()) != n)
          dra::detail::throw_invalid("mask", "mask, weights and grads need the same number of entries");
        std::vector<std::uint8_t> m(mask.data(), mask.data() + n);
        const auto u = rigl_update(m, weights.data(), grads.data(), n, sparsity, update_fraction);
        std::copy(m.begin(), m.end(), mask.mutable_data());
        return py::make_tuple(u.dropped, u.regrown, u.active);
      },
      py::arg("mask"), py::arg("weights"), py::arg("grads"), py::arg("sparsity"), py::arg("update_fraction"),
      "RigL's mask update in place (uint8 mask); returns (dropped, regrown, active). Deterministic.");
  m.def("rigl_update_fraction", &rigl_update_fraction, py::arg("alpha"), py::arg("step"), py::arg("end_step"));
  m.def(
      "next_sparsity",
      [](double current, const std::string& phase, double max_sparsity, double step_up, double step_down) {
        sparsity_schedule_config c{max_sparsity, step_up, step_down};
        c.validate();
        return next_sparsity(c, current, phase_from(phase));
      },
      py::arg("current"), py::arg("phase"), py::arg("max_sparsity") = 0.9, py::arg("step_up") = 0.2,
      py::arg("step_down") = 0.3);
  m.def(
      "rank_for_noise_scale",
      [](double gns, bool valid, double global_batch, int min_rank, int max_rank) {
        rank_schedule_config c{min_rank, max_rank};
        c.validate();
        return rank_for_noise_scale(c, gns, valid, global_batch);
      },
      py::arg("gns"), py::arg("valid"), py::arg("global_batch"), py::arg("min_rank") = 1, py::arg("max_rank") = 8);
}

}  // namespace dra::python
