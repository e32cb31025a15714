#pragma once
// Gradient compression inside the elastic controller's bucketed reduction (part of dra::dra): a
// bucket_hook that runs the torch-free codecs of include/dra/compress/ on each bucket (one codec per
// bucket, built on first use), selected with the option `compress` or installed by hand with
// controller::set_bucket_hook. What its state does on a grow, a shrink and a crash, and why the
// codecs run on the host: docs/design/sustainable.md.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dra/compress/codecs.hpp"
#include "dra/torch/elastic/bucket_hook.hpp"

namespace dra::elastic {

class codec_hook final : public bucket_hook {
 public:
  /// `spec`: a dra::compress::make_codec spec other than "masked" (masks come from a trainer, not
  /// from an option). Throws std::invalid_argument naming the spec and the fix.
  explicit codec_hook(std::string spec, std::uint64_t seed = 0);
  /// Throws std::invalid_argument (option `compress`) when `spec` cannot be a controller's codec.
  static void validate_spec(const std::string& spec);

  void reduce(comm::communicator& comm, std::size_t index, const bucket_layout& layout, at::Tensor& grads,
              at::Tensor& exact) override;
  std::vector<std::uint8_t> shared_state() const override;
  void load_shared_state(const std::vector<std::uint8_t>& bytes) override;
  void world_changed(hook_transition how) override;
  hook_bytes bytes() const override;

  const std::string& spec() const noexcept { return spec_; }
  /// The codec of bucket `index` (null before its first reduction).
  compress::gradient_codec* codec(std::size_t index) const noexcept;
  std::size_t buckets() const noexcept { return codecs_.size(); }
  /// Sum of |error feedback| over every bucket (0 after a clear): for tests and logs.
  double error_feedback_norm1() const;

 private:
  compress::gradient_codec& codec_for(std::size_t index);

  std::string spec_;
  std::uint64_t seed_;
  std::vector<std::unique_ptr<compress::gradient_codec>> codecs_;
  hook_bytes dropped_;  ///< counters of codecs replaced by a load (the totals stay monotonic)
};

}  // namespace dra::elastic
