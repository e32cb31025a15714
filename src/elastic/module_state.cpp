// Model signatures and the LibTorch state provider (module parameters/buffers + optimizer).
#include <cxxabi.h>
#include <torch/torch.h>

#include <cstdlib>
#include <map>
#include <sstream>
#include <typeinfo>

#include "dra/error.hpp"
#include "dra/torch/elastic/state.hpp"

namespace dra::elastic {

namespace {
std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string list_some(const std::vector<std::string>& names) {
  std::string s = "[";
  for (std::size_t i = 0; i < names.size() && i < 3; ++i) s += (i ? ", '" : "'") + names[i] + "'";
  return s + (names.size() > 3 ? ", ...]" : "]");
}

std::string dtype_name(const at::Tensor& t) {
  // The same spelling as Python's str(tensor.dtype), so signatures read the same everywhere.
  switch (t.scalar_type()) {
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kLong:
      return "torch.int64";
    case at::kInt:
      return "torch.int32";
    case at::kShort:
      return "torch.int16";
    case at::kChar:
      return "torch.int8";
    case at::kByte:
      return "torch.uint8";
    case at::kBool:
      return "torch.bool";
    case at::kComplexFloat:
      return "torch.complex64";
    case at::kComplexDouble:
      return "torch.complex128";
    default:
      return std::string("torch.") + c10::toString(t.scalar_type());
  }
}
}  // namespace

std::string signature_mismatch(const std::vector<tensor_spec>& a, const std::vector<tensor_spec>& b,
                               const std::string& a_name, const std::string& b_name) {
  std::map<std::string, const tensor_spec*> in_a, in_b;
  for (const auto& s : a) in_a[s.name] = &s;
  for (const auto& s : b) in_b[s.name] = &s;
  std::vector<std::string> missing, extra;
  for (const auto& [n, _] : in_a)
    if (!in_b.count(n)) missing.push_back(n);
  for (const auto& [n, _] : in_b)
    if (!in_a.count(n)) extra.push_back(n);
  if (!missing.empty()) return b_name + "'s model lacks " + list_some(missing);
  if (!extra.empty()) return b_name + "'s model has unexpected " + list_some(extra);
  for (const auto& s : a) {  // in the model's order: the first differing tensor is named
    const tensor_spec* o = in_b[s.name];
    if (s.shape != o->shape || s.dtype != o->dtype)
      return "'" + s.name + "': " + a_name + " has shape " + shape_text(s.shape) + " " + s.dtype + ", " + b_name +
             " has " + shape_text(o->shape) + " " + o->dtype;
  }
  return {};
}

std::string signature_mismatch(const std::vector<tensor_spec>& world, const std::vector<tensor_spec>& joiner) {
  return signature_mismatch(world, joiner, "world", "joiner");
}

std::string layout_mismatch(const state_layout& a, const state_layout& b, const std::string& a_name,
                            const std::string& b_name) {
  auto shown = [](const state_layout& l, const std::string& part) {
    const auto it = l.find(part);
    return it == l.end() ? std::string("none") : "'" + it->second + "'";
  };
  std::vector<std::string> parts;
  for (const auto& [k, _] : a) parts.push_back(k);
  for (const auto& [k, _] : b)
    if (!a.count(k)) parts.push_back(k);
  for (const auto& part : parts)
    if (shown(a, part) != shown(b, part))
      return "the " + part + " differs: " + a_name + " has " + shown(a, part) + ", " + b_name + " has " +
             shown(b, part) + " (the state it hands over could not be loaded)";
  return {};
}

module_state::module_state(torch::nn::Module& module, torch::optim::Optimizer* optimizer)
    : module_(module), optimizer_(optimizer) {}

std::vector<tensor_spec> module_state::signature() {
  std::vector<tensor_spec> out;
  for (const auto& p : module_.named_parameters())
    out.push_back({p.key(), p.value().sizes().vec(), dtype_name(p.value())});
  for (const auto& b : module_.named_buffers())
    out.push_back({b.key(), b.value().sizes().vec(), dtype_name(b.value())});
  return out;
}

state_layout module_state::layout() {
  state_layout out;
  if (optimizer_ == nullptr) return out;
  // The class (an SGD's state cannot be loaded into an Adam) and each group's size.
  const auto& o = *optimizer_;
  std::string name = typeid(o).name();
  int status = 0;
  if (char* readable = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status)) {
    if (status == 0) name = readable;
    std::free(readable);
  }
  out["optimizer"] = name;
  std::string groups;
  for (const auto& g : optimizer_->param_groups())
    groups += (groups.empty() ? "" : ", ") + std::to_string(g.params().size()) + " params";
  out["optimizer.param_groups"] = "[" + groups + "]";
  return out;
}

state_provider::snapshot module_state::collect() {
  snapshot s;
  for (const auto& p : module_.named_parameters()) s.tensors.push_back(p.value().detach().contiguous());
  for (const auto& b : module_.named_buffers()) s.tensors.push_back(b.value().detach().contiguous());
  // The optimizer's state (momentum buffers, Adam moments, step counts) and options: serialised
  // with torch::serialize into the manifest (it is chunked on the wire like the rest). Not the RNG:
  // each process keeps its own, as under torch's DDP (copied, every rank drew the sender's numbers).
  torch::serialize::OutputArchive archive;
  if (optimizer_ != nullptr) optimizer_->save(archive);
  std::ostringstream os;
  archive.save_to(os);
  s.manifest = os.str();
  return s;
}

std::vector<at::Tensor> module_state::prepare(const std::string&) {
  std::vector<at::Tensor> out;
  // Parameters are contiguous in LibTorch modules: bytes land straight in the model's storage.
  for (const auto& p : module_.named_parameters())
    out.push_back(p.value().is_contiguous() ? p.value().detach() : torch::empty_like(p.value()));
  for (const auto& b : module_.named_buffers())
    out.push_back(b.value().is_contiguous() ? b.value().detach() : torch::empty_like(b.value()));
  return out;
}

void module_state::load(const std::string& manifest, const std::vector<at::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  std::size_t i = 0;
  for (const auto& p : module_.named_parameters()) {
    if (!tensors[i].is_same(p.value()) && tensors[i].data_ptr() != p.value().data_ptr()) p.value().copy_(tensors[i]);
    ++i;
  }
  for (const auto& b : module_.named_buffers()) {
    if (tensors[i].data_ptr() != b.value().data_ptr()) b.value().copy_(tensors[i]);
    ++i;
  }
  torch::serialize::InputArchive archive;
  archive.load_from(manifest.data(), manifest.size());
  if (optimizer_ != nullptr) optimizer_->load(archive);
}

void module_state::scale_learning_rate(double factor) {
  if (optimizer_ == nullptr) return;
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(group.options().get_lr() * factor);
}

}  // namespace dra::elastic
