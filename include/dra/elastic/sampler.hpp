#pragma once
// Exactly-once data over a world that changes size (docs/design/elastic.md). Header-only, no torch.
//
// Each data epoch has one deterministic global order of the dataset's indices
// (epoch_order(dataset_size, seed, epoch), identical on every rank, in C++ and Python). A step
// consumes the next `global_batch` positions of that order from the *cursor*; each rank takes its
// contiguous share (rank_share). The cursor moves only when a step commits (its gradients were
// reduced over the whole world), so after any resize or crash the samples not yet consumed are
// re-partitioned over the new world by the same two functions: nothing is skipped or repeated.
// The elastic controller drives set_world / commit and hands the position to joiners.
#include <cstdint>
#include <string>
#include <vector>

#include "dra/elastic/membership.hpp"
#include "dra/error.hpp"

namespace dra::elastic {

/// Where the data stands: what a joiner needs to continue exactly where the world is.
struct sampler_position {
  std::int64_t epoch = 0;
  std::int64_t cursor = 0;
  std::int64_t global_batch = 1;
  std::uint64_t seed = 0;
};

class elastic_sampler {
 public:
  /// `shuffle` false: every epoch takes the samples in index order (the order then depends on
  /// nothing, and the seed only has to match).
  elastic_sampler(std::int64_t dataset_size, std::int64_t global_batch, std::uint64_t seed = 0, bool drop_last = false,
                  bool shuffle = true)
      : dataset_size_(dataset_size),
        global_batch_(global_batch),
        seed_(seed),
        drop_last_(drop_last),
        shuffle_(shuffle) {
    if (dataset_size < 1)
      dra::detail::throw_invalid("dataset_size",
                                 "must be >= 1 (the number of samples), got " + std::to_string(dataset_size));
    if (global_batch < 1)
      dra::detail::throw_invalid(
          "global_batch",
          "must be >= 1 (samples per optimizer step over the whole world), got " + std::to_string(global_batch));
  }

  std::int64_t dataset_size() const noexcept { return dataset_size_; }
  std::int64_t global_batch() const noexcept { return global_batch_; }
  std::uint64_t seed() const noexcept { return seed_; }
  bool drop_last() const noexcept { return drop_last_; }
  bool shuffle() const noexcept { return shuffle_; }
  std::int64_t epoch() const noexcept { return epoch_; }
  std::int64_t cursor() const noexcept { return cursor_; }
  int world() const noexcept { return world_; }
  int rank() const noexcept { return rank_; }

  /// Positions of an epoch that steps consume (drop_last cuts the incomplete last batch).
  std::int64_t epoch_size() const noexcept {
    return drop_last_ ? dataset_size_ - dataset_size_ % global_batch_ : dataset_size_;
  }
  bool exhausted() const noexcept { return cursor_ >= epoch_size(); }
  /// Steps left in this epoch.
  std::int64_t steps_left() const noexcept {
    const std::int64_t left = epoch_size() - cursor_;
    return left <= 0 ? 0 : (left + global_batch_ - 1) / global_batch_;
  }

  /// The current step's global batch, as positions in the epoch's order.
  index_range step_range() const { return step_batch(cursor_, global_batch_, epoch_size()); }
  /// This rank's share of the current step.
  index_range share_range() const { return rank_share(step_range(), world_, rank_); }
  /// Fraction of the samples of the `steps` steps from the cursor that are this rank's (its
  /// gradient's weight in the mean; several steps: one reduction for accumulated batches).
  double share_weight(int steps = 1) const {
    std::int64_t mine = 0, all = 0;
    for_steps(steps, [&](index_range step) {
      mine += rank_share(step, world_, rank_).size();
      all += step.size();
    });
    return all > 0 ? static_cast<double>(mine) / static_cast<double>(all) : 0.0;
  }
  /// Samples of the `steps` steps from the cursor (the epoch's end cuts them).
  std::int64_t samples(int steps = 1) const {
    std::int64_t all = 0;
    for_steps(steps, [&](index_range step) { all += step.size(); });
    return all;
  }

  /// The epoch's global order (cached per epoch).
  const std::vector<std::int64_t>& order() {
    if (order_epoch_ != epoch_) {
      if (shuffle_) {
        order_ = epoch_order(dataset_size_, seed_, epoch_);
      } else {
        order_.resize(static_cast<std::size_t>(dataset_size_));
        for (std::int64_t i = 0; i < dataset_size_; ++i) order_[static_cast<std::size_t>(i)] = i;
      }
      order_epoch_ = epoch_;
    }
    return order_;
  }
  /// This rank's sample ids for the current step.
  std::vector<std::int64_t> indices() {
    const auto r = share_range();
    const auto& o = order();
    return {o.begin() + r.begin, o.begin() + r.end};
  }
  /// A rank's sample ids for the step that starts at `cursor` in a world of `world` ranks (what a
  /// data loader prefetching ahead asks for: the steps before it are assumed to commit).
  std::vector<std::int64_t> indices_at(std::int64_t cursor, int world, int rank) {
    const auto r = rank_share(step_batch(cursor, global_batch_, epoch_size()), world, rank);
    const auto& o = order();
    return {o.begin() + r.begin, o.begin() + r.end};
  }
  /// Every rank's sample ids of the current step (the global batch).
  std::vector<std::int64_t> step_indices() {
    const auto r = step_range();
    const auto& o = order();
    return {o.begin() + r.begin, o.begin() + r.end};
  }

  // -- transitions (driven by the controller) ----------------------------------------------
  void set_world(int world, int rank) {
    if (world < 1) dra::detail::throw_invalid("world", "must be >= 1, got " + std::to_string(world));
    if (rank < 0 || rank >= world)
      dra::detail::throw_invalid("rank", "must lie in [0, " + std::to_string(world) + "), got " + std::to_string(rank));
    world_ = world;
    rank_ = rank;
  }
  /// The current step's samples are consumed (`steps` consecutive steps: accumulated batches).
  void commit(int steps = 1) {
    for (int i = 0; i < steps && !exhausted(); ++i) cursor_ = step_range().end;
  }
  void next_epoch() noexcept {
    ++epoch_;
    cursor_ = 0;
  }
  /// Ends iteration for a process that leaves training (the job finished while it stood by).
  void finish() noexcept { epoch_ = INT64_MAX / 2; }
  /// AdaScale-style batch change; keeps the cursor (the next step just takes more or fewer).
  void set_global_batch(std::int64_t global_batch) {
    if (global_batch < 1)
      dra::detail::throw_invalid("global_batch", "must be >= 1, got " + std::to_string(global_batch));
    global_batch_ = global_batch;
  }

  sampler_position position() const noexcept { return {epoch_, cursor_, global_batch_, seed_}; }
  /// Takes the world's position. Throws std::invalid_argument (changing nothing) when the seed
  /// differs or the cursor lies outside the epoch.
  void set_position(const sampler_position& p) {
    if (p.seed != seed_)
      dra::detail::throw_invalid("seed", "the world's sampler uses seed " + std::to_string(p.seed) + ", this process " +
                                             std::to_string(seed_) + "; pass the same seed everywhere");
    if (p.global_batch < 1)
      dra::detail::throw_invalid("global_batch", "must be >= 1, got " + std::to_string(p.global_batch));
    const std::int64_t size = drop_last_ ? dataset_size_ - dataset_size_ % p.global_batch : dataset_size_;
    if (p.epoch < 0 || p.cursor < 0 || p.cursor > size)
      dra::detail::throw_invalid("cursor", "position (epoch " + std::to_string(p.epoch) + ", cursor " +
                                               std::to_string(p.cursor) + ") lies outside an epoch of " +
                                               std::to_string(size) + " samples");
    epoch_ = p.epoch;
    cursor_ = p.cursor;
    global_batch_ = p.global_batch;
  }

 private:
  /// Calls `f` with each of the (at most) `steps` step ranges from the cursor, within the epoch.
  template <class F>
  void for_steps(int steps, F&& f) const {
    std::int64_t cursor = cursor_;
    for (int i = 0; i < std::max(steps, 1) && cursor < epoch_size(); ++i) {
      const auto step = step_batch(cursor, global_batch_, epoch_size());
      f(step);
      cursor = step.end;
    }
  }

  std::int64_t dataset_size_;
  std::int64_t global_batch_;
  std::uint64_t seed_;
  bool drop_last_;
  bool shuffle_;
  std::int64_t epoch_ = 0;
  std::int64_t cursor_ = 0;
  int world_ = 1;
  int rank_ = 0;
  std::int64_t order_epoch_ = -1;
  std::vector<std::int64_t> order_;
};

}  // namespace dra::elastic
