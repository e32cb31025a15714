// Bindings of the gradient codecs on numpy float32 arrays through a collective
// written in Python (torch.distributed in a job), and dynamic sparsity (RigL masks and their rules).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <map>

#include "bindings.hpp"
#include "dra/compress/codecs.hpp"
#include "dra/compress/rigl.hpp"
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

// A rigl_config from keyword options (names as in dra.Controller's `sparsity` option).
rigl_config rigl_config_from(const py::dict& d) {
  rigl_config c;
  const std::map<std::string, std::function<void(py::handle)>> fields = {
      {"max_sparsity", [&](py::handle x) { c.max_sparsity = x.cast<double>(); }},
      {"every", [&](py::handle x) { c.every = x.cast<std::int64_t>(); }},
      {"alpha", [&](py::handle x) { c.alpha = x.cast<double>(); }},
      {"end_step", [&](py::handle x) { c.end_step = x.cast<std::int64_t>(); }},
      {"step_up", [&](py::handle x) { c.step_up = x.cast<double>(); }},
      {"step_down", [&](py::handle x) { c.step_down = x.cast<double>(); }},
      {"ramp_start", [&](py::handle x) { c.ramp_start = x.cast<std::int64_t>(); }},
      {"ramp_steps", [&](py::handle x) { c.ramp_steps = x.cast<std::int64_t>(); }},
  };
  for (auto item : d) {
    const auto key = py::str(item.first).cast<std::string>();
    const auto it = fields.find(key);
    if (it == fields.end()) {
      std::string valid;
      for (const auto& [n, _] : fields) valid += (valid.empty() ? "" : ", ") + n;
      dra::detail::throw_invalid("sparsity", "unknown key '" + key + "'; valid: " + valid);
    }
    it->second(item.second);
  }
  c.validate();
  return c;
}

// Float32 C-contiguous arrays (or None) as read-only pointers, one per tensor; `sizes` (when given)
// receives each one's number of entries (0 for None), which the callers check against the tensors':
// the C++ side reads that many floats through the bare pointer.
std::vector<const float*> pointers(const std::vector<py::object>& arrays, std::vector<py::array>& keep,
                                   std::vector<std::size_t>* sizes = nullptr) {
  std::vector<const float*> out;
  for (const auto& a : arrays) {
    if (a.is_none()) {
      out.push_back(nullptr);
      if (sizes) sizes->push_back(0);
      continue;
    }
    keep.push_back(py::array_t < float, py::array::c_style | py::array::forcecast > ::ensure(a));
    if (!keep.back()) dra::detail::throw_invalid("weights", "expected float32 arrays (or None)");
    out.push_back(static_cast<const float*>(keep.back().data()));
    if (sizes) sizes->push_back(static_cast<std::size_t>(keep.back().size()));
  }
  return out;
}

// Refuses an array whose number of entries differs from its tensor's (`what`: "weights" or "grads").
void check_sizes(const char* what, const std::vector<const float*>& ptrs, const std::vector<std::size_t>& sizes,
                 const std::vector<std::size_t>& expected) {
  for (std::size_t t = 0; t < ptrs.size() && t < expected.size(); ++t)
    if (ptrs[t] != nullptr && sizes[t] != expected[t])
      dra::detail::throw_invalid(what, "array " + std::to_string(t) + " has " + std::to_string(sizes[t]) +
                                           " entries for a tensor of " + std::to_string(expected[t]) +
                                           "; pass each parameter's own values, one array per tensor, in order");
}

py::array mask_array(const std::vector<std::uint8_t>& m) {
  py::array_t<std::uint8_t> out(static_cast<py::ssize_t>(m.size()));
  std::copy(m.begin(), m.end(), out.mutable_data());
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
          [](gradient_codec& c, const std::vector<py::array>& grads, py::object world, py::object weights,
             py::object exact) {
            auto r = refs(grads);
            std::vector<py::array> keep;
            if (!weights.is_none()) {
              std::vector<std::size_t> sizes, expected;
              const auto w = pointers(weights.cast<std::vector<py::object>>(), keep, &sizes);
              if (w.size() != r.size())
                dra::detail::throw_invalid(
                    "weights", std::to_string(w.size()) + " weights for " + std::to_string(r.size()) + " gradients");
              for (const auto& g : r) expected.push_back(g.size());
              check_sizes("weights", w, sizes, expected);
              for (std::size_t i = 0; i < r.size(); ++i) r[i].weights = w[i];
            }
            py_collective coll(std::move(world));
            if (exact.is_none()) {
              c.reduce(r, coll);
              return;
            }
            auto e = refs({exact.cast<py::array>()});
            c.reduce_with(r, coll, e[0].data, e[0].size());
          },
          py::arg("grads"), py::arg("world"), py::arg("weights") = py::none(), py::arg("exact") = py::none(),
          "Reduces the gradients in place; `weights` (the parameters' values, one array or None per "
          "gradient) are read by the 'masked' codec on its mask-update steps; `exact` (a float32 array) is "
          "summed over the world in place, uncompressed, riding the codec's first all-reduce.")
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
      .def(
          "set_phase",
          [](gradient_codec& c, const std::string& phase) {
            auto* m = dynamic_cast<masked_sync_codec*>(&c);
            if (!m)
              dra::detail::throw_invalid("codec", "set_phase needs the 'masked' codec, this is '" + c.name() + "'");
            m->set_phase(phase_from(phase));
          },
          "'masked': the convergence phase this rank proposes the next sparsity from.")
      .def_property_readonly(
          "update_next",
          [](const gradient_codec& c) {
            auto* m = dynamic_cast<const masked_sync_codec*>(&c);
            return m != nullptr && m->update_next();
          },
          "'masked': the next reduce() updates the masks (the dense gradient travels).")
      .def_property_readonly(
          "sparsity",
          [](const gradient_codec& c) {
            auto* m = dynamic_cast<const masked_sync_codec*>(&c);
            return m ? m->masks().sparse_fraction() : 0.0;
          },
          "'masked': the fraction of the sparsified tensors' entries pruned now (0 for other codecs).")
      .def_property_readonly(
          "masks",
          [](const gradient_codec& c) {
            py::list out;
            auto* m = dynamic_cast<const masked_sync_codec*>(&c);
            if (!m) return out;
            for (std::size_t t = 0; t < m->masks().size(); ++t)
              out.append(m->masks().sparsified(t) ? py::object(mask_array(m->masks().mask(t))) : py::none());
            return out;
          },
          "'masked': each tensor's mask (uint8, 1 active), None for a dense one; empty before the first reduce.")
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

  m.def(
      "make_codec",
      [](const std::string& spec, std::uint64_t seed, const py::dict& sparsity) {
        const auto config = rigl_config_from(sparsity);
        // The RigL options configure 'masked' only: with another codec they would be ignored.
        if (!sparsity.empty() && spec.rfind("masked", 0) != 0)
          dra::detail::throw_invalid("sparsity", "configures the 'masked' codec only, the spec is '" + spec +
                                                     "'; use 'masked[:<max sparsity>]' or drop sparsity");
        return make_codec(spec, seed, config);
      },
      py::arg("spec"), py::arg("seed") = 0, py::arg("sparsity") = py::dict(),
      "fp32, fp16, bf16, powersgd:<rank>, topk:<fraction>, random:<keep fraction>, masked[:<max sparsity>] "
      "(`sparsity`: the RigL options, as dra.Controller's).");

  m.def(
      "rigl_update",
      [](const py::array& mask_in, py::array_t<float, py::array::c_style | py::array::forcecast> weights,
         py::array_t<float, py::array::c_style | py::array::forcecast> grads, double sparsity, double update_fraction,
         std::uint64_t tie_seed) {
        // The mask is updated in place: a converted copy (a bool or int array, a strided view) would
        // take the update and be thrown away, leaving the caller's mask unchanged. Refused instead.
        if (!py::isinstance<py::array_t<std::uint8_t>>(mask_in) || mask_in.dtype().kind() != 'u' ||
            mask_in.itemsize() != 1 || !(mask_in.flags() & py::array::c_style) || !mask_in.writeable())
          dra::detail::throw_invalid("mask",
                                     "must be a writable C-contiguous uint8 array (it is updated in place), got " +
                                         py::str(mask_in.dtype()).cast<std::string>() +
                                         ((mask_in.flags() & py::array::c_style) ? "" : ", not contiguous") +
                                         "; pass np.ascontiguousarray(mask, dtype=np.uint8) and use that array");
        auto mask = py::reinterpret_borrow<py::array_t<std::uint8_t>>(mask_in);
        const auto n = static_cast<std::size_t>(weights.size());
        if (static_cast<std::size_t>(grads.size()) != n || static_cast<std::size_t>(mask.size()) != n)
          dra::detail::throw_invalid("mask", "mask, weights and grads need the same number of entries");
        std::vector<std::uint8_t> m(mask.data(), mask.data() + n);
        const auto u = rigl_update(m, weights.data(), grads.data(), n, sparsity, update_fraction, tie_seed);
        std::copy(m.begin(), m.end(), mask.mutable_data());
        return py::make_tuple(u.dropped, u.regrown, u.active);
      },
      py::arg("mask"), py::arg("weights"), py::arg("grads"), py::arg("sparsity"), py::arg("update_fraction"),
      py::arg("tie_seed") = 0,
      "RigL's mask update in place (uint8 mask; grads: the dense gradient); returns (dropped, regrown, active). "
      "Ties are broken by keys drawn from tie_seed (rigl_tie_seed), the same on every rank.");
  m.def("rigl_tie_seed", &rigl_tie_seed, py::arg("seed"), py::arg("step"), py::arg("tensor"));
  m.def("cubic_sparsity", &cubic_sparsity, py::arg("step"), py::arg("start"), py::arg("steps"),
        py::arg("final_sparsity"), "Zhu & Gupta's gradual schedule.");
  py::class_<rigl_masks>(m, "RiglMasks",
                         "RigL masks of a list of tensors (those with 2+ dimensions are sparsified), their "
                         "schedule and update: the one implementation dra.compress.DynamicSparsifier and the "
                         "'masked' codec share.")
      .def(py::init([](std::uint64_t seed, const py::kwargs& options) {
             return rigl_masks(rigl_config_from(options), seed);
           }),
           py::arg("seed") = 0, "RiglMasks(seed=0, **options): options as dra.Controller's `sparsity`.")
      .def("fit", &rigl_masks::fit, py::arg("shapes"), "Sizes the masks on first use (all active).")
      .def_property_readonly("sparsity", &rigl_masks::sparsity, "The target of the latest update.")
      .def("sparse_fraction", &rigl_masks::sparse_fraction)
      .def("sparsified", &rigl_masks::sparsified, py::arg("tensor"))
      .def(
          "mask", [](const rigl_masks& r, std::size_t t) { return mask_array(r.mask(t)); }, py::arg("tensor"))
      .def(
          "update_due", [](const rigl_masks& r, std::int64_t step) { return r.config().update_due(step); },
          py::arg("step"), "Whether the step after `step` completed ones updates the masks.")
      .def(
          "target",
          [](const rigl_masks& r, std::int64_t step, const std::string& phase) {
            return r.proposal(step, phase_from(phase));
          },
          py::arg("step"), py::arg("phase"),
          "The next target: the cubic ramp, or the phase rule under the ceiling learned from divergence.")
      .def_property_readonly("ceiling", &rigl_masks::ceiling,
                             "The phase rule's cap: max_sparsity until a rise was followed by divergence.")
      .def(
          "update",
          [](rigl_masks& r, std::int64_t step, double target, const std::vector<py::object>& weights,
             const std::vector<py::object>& grads) {
            std::vector<py::array> keep;
            std::vector<std::size_t> wsizes, gsizes;
            const auto w = pointers(weights, keep, &wsizes);
            const auto g = pointers(grads, keep, &gsizes);
            // Only a sparsified tensor's arrays are read (its mask's size); a dense one's are ignored.
            auto expected = [&](const std::vector<std::size_t>& sizes) {
              std::vector<std::size_t> out;
              for (std::size_t t = 0; t < sizes.size(); ++t)
                out.push_back(r.sparsified(t) ? r.mask(t).size() : sizes[t]);
              return out;
            };
            check_sizes("weights", w, wsizes, expected(wsizes));
            check_sizes("grads", g, gsizes, expected(gsizes));
            const auto u = r.update(step, target, w, g);
            return py::make_tuple(u.dropped, u.regrown, u.active);
          },
          py::arg("step"), py::arg("target"), py::arg("weights"), py::arg("grads"),
          "RigL's update of every sparsified tensor (grads: the dense, world-averaged gradients); returns "
          "(dropped, regrown, active).");
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
