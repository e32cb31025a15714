#pragma once
// The exactly-once sampler as a torch::data sampler (part of dra::dra), so a LibTorch trainer can
// feed its elastic world through torch::data::make_data_loader (usage: docs/guide/elastic.md, "C++
// trainers"). Each batch is this rank's share of the world's current step, and the cursor moves only
// when the controller commits, so a failed step yields the same samples again. Use workers(0): a
// loader with workers asks ahead, for a world that may change before the batch is used.
#include <torch/data/samplers/base.h>
#include <torch/serialize/archive.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "dra/elastic/sampler.hpp"
#include "dra/error.hpp"

namespace dra::elastic {

class torch_sampler final : public torch::data::samplers::Sampler<std::vector<std::size_t>> {
 public:
  explicit torch_sampler(std::shared_ptr<elastic_sampler> sampler) : sampler_(std::move(sampler)) {
    if (!sampler_) dra::detail::throw_invalid("sampler", "an elastic_sampler is required");
  }

  /// The data loader's epoch start: nothing to do (the controller's next_epoch moves the epoch).
  void reset(std::optional<std::size_t> = std::nullopt) override {}

  /// This rank's share of the current step (asked for after the previous step's commit); the same
  /// samples again after a failed step; nothing once the epoch is consumed.
  std::optional<std::vector<std::size_t>> next(std::size_t) override {
    if (sampler_->exhausted()) return std::nullopt;
    const auto ids = sampler_->indices();
    return std::vector<std::size_t>(ids.begin(), ids.end());
  }

  /// The position travels with the world's state (the controller hands it to joiners); a
  /// checkpoint saves sampler->position() itself.
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}

  elastic_sampler& sampler() noexcept { return *sampler_; }

 private:
  std::shared_ptr<elastic_sampler> sampler_;
};

}  // namespace dra::elastic
