#pragma once
// What an elastic world hands over to joiners (part of dra::dra: needs LibTorch). The controller
// moves the bytes; a state provider says what the trainer's state is and loads it.
#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace dra::elastic {

/// Name, shape and dtype of one tensor of the model: what a joiner must match.
struct tensor_spec {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string dtype;
  bool operator==(const tensor_spec& o) const { return name == o.name && shape == o.shape && dtype == o.dtype; }
};

/// A readable description of the first difference between two model signatures ("" when equal).
std::string signature_mismatch(const std::vector<tensor_spec>& world, const std::vector<tensor_spec>& joiner);
/// The same, naming the two sides ("process 0" and "process 1" for two founding processes).
std::string signature_mismatch(const std::vector<tensor_spec>& a, const std::vector<tensor_spec>& b,
                               const std::string& a_name, const std::string& b_name);

/// What else of the state a handoff sends besides the model's tensors, as named parts (the
/// optimizer's class and parameter groups, the LR scheduler's class, the gradient codec): a joiner
/// whose layout differs could not load the world's state, so it is refused before anything is sent.
using state_layout = std::map<std::string, std::string>;
/// The first part that differs, said plainly ("" when equal).
std::string layout_mismatch(const state_layout& a, const state_layout& b, const std::string& a_name,
                            const std::string& b_name);

/// The trainer's state, as the controller hands it over: the controller moves the bytes
/// (manifest, then the tensors in bounded chunks) and adds its own part (step counter, sampler
/// position); the provider says what the state is and loads it.
class state_provider {
 public:
  virtual ~state_provider() = default;
  /// The model's parameters and buffers (name, shape, dtype), compared at start and admission.
  virtual std::vector<tensor_spec> signature() = 0;
  /// The rest of the state's layout (state_layout), compared at start and admission. Default: none.
  virtual state_layout layout() { return {}; }
  /// Sender: every tensor to hand over (contiguous tensors) and an opaque manifest that
  /// describes them and carries the non-tensor state.
  struct snapshot {
    std::vector<at::Tensor> tensors;
    std::string manifest;
    /// With deferred_handoff, tensors from this index on (the optimizer's) may reach a joiner
    /// after its first forward and backward; load() is then called once they arrived. Everything
    /// before it must land in place in prepare()'s tensors (the model's own storage). Default:
    /// nothing is deferred.
    std::size_t deferrable_from = static_cast<std::size_t>(-1);
  };
  virtual snapshot collect() = 0;
  /// Receiver: the destinations for a manifest (contiguous tensors of the sender's shapes and
  /// dtypes; may alias the model's own storage, so bytes land in place).
  virtual std::vector<at::Tensor> prepare(const std::string& manifest) = 0;
  /// Receiver: every byte arrived in `tensors`; load them (and the manifest's other state).
  virtual void load(const std::string& manifest, const std::vector<at::Tensor>& tensors) = 0;
  /// AdaScale-style batch change (batch_mode::adascale): multiply the learning rate by `factor`.
  /// Called on every member at the same step boundary, before state goes to joiners.
  virtual void scale_learning_rate(double factor) = 0;
  /// The process left the world and waits (standby, or back to the caller): give the device's
  /// memory back (move the state to the CPU, release the allocator's cached blocks), so that a
  /// standby never holds a device another job could use. Default: nothing.
  virtual void release_device() {}
  /// Before the process enters a world again (its state is received right after): move the state
  /// back where release_device() found it.
  virtual void restore_device() {}
};

/// State provider of a LibTorch trainer: the module's parameters and buffers (received in place)
/// and the optimizer's state (serialised with torch::serialize into the manifest). The random state
/// stays each process's own, as under torch's DDP.
class module_state final : public state_provider {
 public:
  /// Both must outlive the controller. `optimizer` may be null (plain parameter updates).
  module_state(torch::nn::Module& module, torch::optim::Optimizer* optimizer);
  std::vector<tensor_spec> signature() override;
  /// The optimizer's class and its parameter groups (sizes).
  state_layout layout() override;
  snapshot collect() override;
  std::vector<at::Tensor> prepare(const std::string& manifest) override;
  void load(const std::string& manifest, const std::vector<at::Tensor>& tensors) override;
  void scale_learning_rate(double factor) override;

 private:
  torch::nn::Module& module_;
  torch::optim::Optimizer* optimizer_;
};

/// Digest (62 bits) of the tensors a provider hands over: equal on every rank of a world after a
/// change (the controller compares it when options.verify).
std::uint64_t state_digest(state_provider& state);

}  // namespace dra::elastic
