#pragma once
// Gradient compression inside the elastic controller's bucketed reduction (part of dra::dra): a
// bucket_hook that runs the torch-free codecs of include/dra/compress/ on each bucket (one codec per
// bucket, built on first use), selected with the option `compress` or installed by hand with
// controller::set_bucket_hook. With `masked` it is sparse training's sync: RigL masks (option
// `sparsity`) whose pruned weights it zeroes at each step boundary. What its state does on a grow, a
// shrink and a crash, and why the codecs run on the host: docs/design/sustainable.md.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dra/compress/codecs.hpp"
#include "dra/torch/elastic/bucket_hook.hpp"

namespace dra::elastic {

class codec_hook final : public bucket_hook {
 public:
  /// `spec`: a dra::compress::make_codec spec; `sparsity` configures "masked"; `seed`: the job's
  /// (the masks' tie keys and random draws). Throws std::invalid_argument naming the spec and the fix.
  explicit codec_hook(std::string spec, std::uint64_t seed = 0, compress::rigl_config sparsity = {});
  /// Throws std::invalid_argument (option `compress`) when `spec` cannot be a controller's codec.
  static void validate_spec(const std::string& spec, const compress::rigl_config& sparsity = {});

  void reduce(comm::communicator& comm, std::size_t index, const bucket_layout& layout, at::Tensor& grads,
              at::Tensor& exact) override;
  std::vector<std::uint8_t> shared_state() const override;
  void load_shared_state(const std::vector<std::uint8_t>& bytes) override;
  void world_changed(hook_transition how) override;
  void step_committed(const signals::convergence_signals& signals) override;
  hook_bytes bytes() const override;

  const std::string& spec() const noexcept { return spec_; }
  /// The codec of bucket `index` (null before its first reduction).
  compress::gradient_codec* codec(std::size_t index) const noexcept;
  std::size_t buckets() const noexcept { return codecs_.size(); }
  /// Sum of |error feedback| over every bucket (0 after a clear): for tests and logs.
  double error_feedback_norm1() const;
  /// `masked`: the fraction of the sparsified parameters' entries pruned now (0 otherwise).
  double sparsity() const;
  /// `masked`: each sparsified parameter and its mask (float 1/0, on the parameter's device), for
  /// a trainer that zeroes optimizer state at pruned entries (dra.Controller's optimizer does).
  std::vector<std::pair<at::Tensor, at::Tensor>> sparsity_masks();

 private:
  compress::gradient_codec& codec_for(std::size_t index);
  /// Zeroes the pruned weights of every parameter this hook has seen (no-op without masks).
  void apply_masks();
  /// Moves bucket `index`'s codec state along when its parameters changed since its latest
  /// reduction (a parameter frozen or unfrozen): each parameter keeps its own state.
  void follow_layout(compress::gradient_codec& codec, std::size_t index, const std::vector<at::Tensor>& params,
                     const std::vector<std::vector<std::int64_t>>& shapes);

 public:
  /// For new tensor j, the tensor of `before` it continues (-1: none): the longest common
  /// subsequence of the two shape lists (the same on every member: it reads nothing else).
  static std::vector<std::int64_t> common_tensors(const std::vector<std::vector<std::int64_t>>& before,
                                                  const std::vector<std::vector<std::int64_t>>& after);

 private:
  std::string spec_;
  std::uint64_t seed_;
  compress::rigl_config sparsity_;
  std::vector<std::unique_ptr<compress::gradient_codec>> codecs_;
  std::vector<std::vector<at::Tensor>> params_;  ///< per bucket, the parameters of its layout
  /// Per bucket, the tensor shapes the codec's state is for (its latest reduction's layout, or the
  /// sender's with a loaded state).
  std::vector<std::vector<std::vector<std::int64_t>>> state_shapes_;
  /// Per bucket, the masks as tensors on the parameters' devices, and the mask version they show.
  std::vector<std::vector<at::Tensor>> mask_tensors_;
  std::vector<std::uint64_t> mask_versions_;
  hook_bytes dropped_;  ///< counters of codecs replaced by a load (the totals stay monotonic)
};

}  // namespace dra::elastic
