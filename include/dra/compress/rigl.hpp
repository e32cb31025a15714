#pragma once
// Dynamic sparse training with its gradient sync: a model's RigL masks (rigl_masks) and the codec
// `masked` (masked_sync_codec) that sends only the active entries between mask updates and the
// dense gradient on mask-update steps, from which every rank derives the same new masks. Why it is
// built this way, and what differs from the published RigL: docs/design/sustainable.md.
#include "dra/compress/codec.hpp"
#include "dra/compress/sparsity.hpp"

namespace dra::compress {

/// The masks of a list of tensors. Tensors with two or more dimensions (weight matrices,
/// convolutions) are sparsified; the others (biases, norms) stay dense, as in RigL. All masks start
/// full; update() applies rigl_update to each sparsified tensor with a tie seed drawn from
/// (seed, step, tensor), so replicas given the same inputs derive the same masks.
class rigl_masks {
 public:
  explicit rigl_masks(rigl_config config = {}, std::uint64_t seed = 0) : config_(config), seed_(seed) {
    config_.validate();
  }
  const rigl_config& config() const noexcept { return config_; }
  std::uint64_t seed() const noexcept { return seed_; }
  /// The target the masks were last updated to (0 before the first update).
  double sparsity() const noexcept { return sparsity_; }
  /// The phase rule's cap (max_sparsity until a rise was followed by divergence; see proposal).
  double ceiling() const noexcept { return ceiling_; }
  /// The next target: the cubic ramp, or the phase rule under the learned ceiling. The phase rule
  /// alone did not settle: pruning bumps the loss, the controller calls the bump diverging, the
  /// target falls back, and once steady it climbs to the same level again (a cycle of about 200
  /// steps on a small MLP). So a divergence that follows a rise undoes exactly that rise and makes
  /// the level before it the ceiling: the target climbs no higher for the rest of the job (a
  /// conservative error: a divergence from noise caps it too). A divergence at a level held before
  /// still takes step_down.
  double proposal(std::int64_t step, signals::training_phase phase) const {
    if (config_.ramp_steps > 0) return config_.target(sparsity_, step, phase);
    if (phase == signals::training_phase::diverging && rising_) return last_good_;
    const double next = config_.target(sparsity_, step, phase);
    return next > sparsity_ ? std::min(next, std::max(ceiling_, sparsity_)) : next;  // a rise stops at the ceiling
  }
  /// Sizes the masks on first use (all active); throws when the tensors change.
  void fit(const std::vector<std::vector<std::int64_t>>& shapes) {
    if (shapes_.empty()) {
      shapes_ = shapes;
      masks_.resize(shapes.size());
      for (std::size_t t = 0; t < shapes.size(); ++t)
        if (shapes[t].size() >= 2) masks_[t].assign(numel(shapes[t]), 1);
      return;
    }
    if (shapes != shapes_)
      dra::detail::throw_invalid("grads", "the masks were made for " + std::to_string(shapes_.size()) +
                                              " tensors of other shapes; sync the same tensors every step");
  }
  bool fitted() const noexcept { return !shapes_.empty(); }
  /// The tensors change (codec remap_tensors): new tensor i, of shape shapes[i], keeps the mask of
  /// old tensor from[i] when that had the same shape, else starts as fit() starts it (full for two
  /// or more dimensions, none otherwise). No-op before the first fit().
  void remap(const std::vector<std::int64_t>& from, const std::vector<std::vector<std::int64_t>>& shapes) {
    if (!fitted()) return;
    std::vector<std::vector<std::uint8_t>> masks(shapes.size());
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const auto j = from[t];
      if (j >= 0 && static_cast<std::size_t>(j) < shapes_.size() && shapes_[static_cast<std::size_t>(j)] == shapes[t])
        masks[t] = masks_[static_cast<std::size_t>(j)];
      else if (shapes[t].size() >= 2)
        masks[t].assign(numel(shapes[t]), 1);
    }
    shapes_ = shapes;
    masks_ = std::move(masks);
    ++version_;
  }
  std::size_t size() const noexcept { return masks_.size(); }
  bool sparsified(std::size_t t) const { return t < masks_.size() && !masks_[t].empty(); }
  /// Tensor t's mask (1 active); empty for a dense tensor.
  const std::vector<std::uint8_t>& mask(std::size_t t) const { return masks_.at(t); }
  /// Changes on every update that changed a mask (lets a caller cache device copies).
  std::uint64_t version() const noexcept { return version_; }
  /// Fraction of the sparsified tensors' entries that are inactive.
  double sparse_fraction() const {
    std::size_t total = 0, active = 0;
    for (const auto& m : masks_) {
      total += m.size();
      for (auto v : m) active += v;
    }
    return total ? 1.0 - static_cast<double>(active) / static_cast<double>(total) : 0.0;
  }

  /// RigL's update after `step` completed steps, to `target`: weights[t] and grads[t] (the dense,
  /// world-averaged gradient) of every tensor; null pointers for dense tensors are fine.
  mask_update update(std::int64_t step, double target, const std::vector<const float*>& weights,
                     const std::vector<const float*>& grads) {
    if (weights.size() != masks_.size() || grads.size() != masks_.size())
      dra::detail::throw_invalid("weights", std::to_string(weights.size()) + " weights and " +
                                                std::to_string(grads.size()) + " gradients for " +
                                                std::to_string(masks_.size()) + " tensors");
    // Everything is checked before the first mask changes: a refusal leaves every mask as it was.
    if (!(target >= 0.0 && target < 1.0))
      dra::detail::throw_invalid("sparsity", "the target must lie in [0, 1), got " + std::to_string(target));
    for (std::size_t t = 0; t < masks_.size(); ++t)
      if (!masks_[t].empty() && (weights[t] == nullptr || grads[t] == nullptr))
        dra::detail::throw_invalid(
            "weights", "tensor " + std::to_string(t) + " is sparsified: its weights and dense gradient are needed");
    const double fraction = rigl_update_fraction(config_.alpha, step, config_.end_step);
    mask_update total;
    for (std::size_t t = 0; t < masks_.size(); ++t) {
      if (masks_[t].empty()) continue;
      const auto u = rigl_update(masks_[t], weights[t], grads[t], masks_[t].size(), target, fraction,
                                 rigl_tie_seed(seed_, step, t));
      total.dropped += u.dropped;
      total.regrown += u.regrown;
      total.active += u.active;
    }
    if (target > sparsity_ + 1e-9) {
      last_good_ = sparsity_;
      rising_ = true;
    } else if (target < sparsity_ - 1e-9) {
      if (rising_ && config_.ramp_steps == 0) ceiling_ = std::min(ceiling_, std::max(target, last_good_));
      rising_ = false;
    }
    sparsity_ = target;
    if (total.dropped + total.regrown > 0) ++version_;
    return total;
  }

  void save(detail::writer& w) const {
    w.put<double>(config_.max_sparsity);
    w.put<std::int64_t>(config_.every);
    w.put<std::int64_t>(config_.end_step);
    w.put<std::int64_t>(config_.ramp_steps);
    w.put<double>(sparsity_);
    w.put<double>(ceiling_);
    w.put<double>(last_good_);
    w.put<std::uint8_t>(rising_ ? 1 : 0);
    w.put<std::uint64_t>(masks_.size());
    for (std::size_t t = 0; t < masks_.size(); ++t) {
      w.put<std::uint64_t>(shapes_[t].size());
      for (auto d : shapes_[t]) w.put<std::int64_t>(d);
      w.put_bits(masks_[t]);
    }
  }
  /// Reads what save() wrote into a fresh object (validated: nothing of this one changes).
  rigl_masks loaded(detail::reader& r) const {
    const auto max = r.get<double>();
    const auto every = r.get<std::int64_t>();
    const auto end = r.get<std::int64_t>();
    const auto ramp = r.get<std::int64_t>();
    if (max != config_.max_sparsity || every != config_.every || end != config_.end_step || ramp != config_.ramp_steps)
      dra::detail::throw_invalid("state",
                                 "masks made with another sparsity configuration (max_sparsity, every, "
                                 "end_step, ramp_steps); give every process the same");
    rigl_masks out(config_, seed_);
    out.sparsity_ = r.get<double>();
    out.ceiling_ = r.get<double>();
    out.last_good_ = r.get<double>();
    out.rising_ = r.get<std::uint8_t>() != 0;
    if (!(out.sparsity_ >= 0.0 && out.sparsity_ < 1.0 && out.ceiling_ >= 0.0 && out.ceiling_ <= config_.max_sparsity &&
          out.last_good_ >= 0.0 && out.last_good_ < 1.0))
      dra::detail::throw_invalid("state", "a sparsity, ceiling or level out of range");
    const auto n = r.get<std::uint64_t>();
    for (std::uint64_t t = 0; t < n; ++t) {
      std::vector<std::int64_t> shape(r.get<std::uint64_t>());
      for (auto& d : shape) d = r.get<std::int64_t>();
      auto m = r.get_bits();
      if (!m.empty() && m.size() != numel(shape)) dra::detail::throw_invalid("state", "a mask does not fit its shape");
      out.shapes_.push_back(std::move(shape));
      out.masks_.push_back(std::move(m));
    }
    out.version_ = version_ + 1;
    return out;
  }

 private:
  static std::size_t numel(const std::vector<std::int64_t>& shape) {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
  rigl_config config_;
  std::uint64_t seed_;
  double sparsity_ = 0.0;
  double ceiling_ = config_.max_sparsity;  // set in the member list: config_ comes first
  double last_good_ = 0.0;                 // the sparsity before the latest rise
  bool rising_ = false;                    // the latest change of the target was a rise
  std::vector<std::vector<std::int64_t>> shapes_;
  std::vector<std::vector<std::uint8_t>> masks_;
  std::uint64_t version_ = 0;
};

/// Spec "masked": sparse training's gradient sync. Between mask updates one packed all-reduce
/// carries the active entries of every sparsified tensor (a pruned weight's gradient is dropped
/// with the weight, not delayed: no error feedback there) and a random keep = 1 - sparsity share
/// of the dense tensors' entries, drawn from (seed, step) identically on every rank, with error
/// feedback; so at sparsity s the whole payload is (1 - s) of fp32's, biases included. On a
/// mask-update step (rigl_config::update_due) the dense gradient travels whole with each rank's
/// proposed target (set_phase: the rule of rigl_config::target); every rank then holds the same
/// mean gradient and mean target, and updates the same masks from the weights (tensor_ref::weights,
/// equal on every rank). That step's output keeps only the entries active before and after, so a
/// regrown weight starts at zero, as in RigL. The caller zeroes the inactive weights after each
/// optimizer step (the controller does it at the step boundary).
class masked_sync_codec final : public gradient_codec {
 public:
  explicit masked_sync_codec(rigl_config config = {}, std::uint64_t seed = 0) : masks_(config, seed), seed_(seed) {}
  std::string name() const override { return "masked"; }
  const rigl_masks& masks() const noexcept { return masks_; }
  /// The convergence phase this rank proposes the next target from.
  void set_phase(signals::training_phase phase) noexcept { phase_ = phase; }
  /// Whether the next reduce() updates the masks (and so sends the dense gradient).
  bool update_next() const { return masks_.config().update_due(steps_); }
  /// Masks changed by the latest reduce() (dropped, regrown; zero on other steps).
  const mask_update& last_update() const noexcept { return last_; }

  void reduce(std::vector<tensor_ref>& grads, collective& world) override {
    check_inputs(grads, world);
    check_indexable(grads);
    std::vector<std::vector<std::int64_t>> shapes;
    for (const auto& g : grads) shapes.push_back(g.shape);
    masks_.fit(shapes);
    last_ = {};
    if (update_next())
      update_step(grads, world);
    else
      sparse_step(grads, world);
    ++steps_;
  }

 protected:
  void save_extra(detail::writer& w) const override { masks_.save(w); }
  extra_state load_extra(detail::reader& r) const override {
    pending_ = masks_.loaded(r);  // validated; taken by commit_extra once the whole state is read
    return {};
  }
  void commit_extra(extra_state) override { masks_ = std::move(pending_); }
  void remap_extra(const std::vector<std::int64_t>& from,
                   const std::vector<std::vector<std::int64_t>>& shapes) override {
    masks_.remap(from, shapes);
  }

 private:
  void sparse_step(std::vector<tensor_ref>& grads, collective& world) {
    const double keep = 1.0 - masks_.sparsity();
    std::vector<std::vector<std::uint32_t>> picked(grads.size());  // dense tensors: entries sent
    std::vector<float> buf;
    for (std::size_t t = 0; t < grads.size(); ++t) {
      const auto& g = grads[t];
      const std::size_t n = g.size();
      bytes_.dense += 4 * n;
      if (masks_.sparsified(t)) {
        const auto& m = masks_.mask(t);
        for (std::size_t i = 0; i < n; ++i)
          if (m[i]) buf.push_back(g.data[i]);
        continue;
      }
      auto& err = error_for(t, n);
      for (std::size_t i = 0; i < n; ++i) err[i] += g.data[i];
      picked[t] = random_subset(n, keep, t);
      for (auto i : picked[t]) {
        buf.push_back(err[i]);
        err[i] = 0.0f;
      }
      for (auto& e : err) e = carried(e);
    }
    bytes_.sent += 4 * buf.size();
    const std::size_t at = ride_along(buf);
    if (!buf.empty()) world.allreduce_sum(buf.data(), buf.size());
    ride_back(buf, at);
    const float inv = 1.0f / static_cast<float>(world.world_size());
    std::size_t k = 0;
    for (std::size_t t = 0; t < grads.size(); ++t) {
      float* g = grads[t].data;
      const std::size_t n = grads[t].size();
      if (masks_.sparsified(t)) {
        const auto& m = masks_.mask(t);
        for (std::size_t i = 0; i < n; ++i) g[i] = m[i] ? buf[k++] * inv : 0.0f;
        continue;
      }
      std::fill(g, g + n, 0.0f);
      for (auto i : picked[t]) g[i] = buf[k++] * inv;
    }
  }

  void update_step(std::vector<tensor_ref>& grads, collective& world) {
    for (std::size_t t = 0; t < grads.size(); ++t)  // before anything changes
      if (masks_.sparsified(t) && grads[t].weights == nullptr)
        dra::detail::throw_invalid("weights",
                                   "the 'masked' codec updates its masks from the weights at this step; "
                                   "pass tensor_ref::weights for tensor " +
                                       std::to_string(t));
    std::vector<float> buf;
    for (std::size_t t = 0; t < grads.size(); ++t) {
      const auto& g = grads[t];
      const std::size_t n = g.size();
      bytes_.dense += 4 * n;
      if (masks_.sparsified(t)) {
        buf.insert(buf.end(), g.data, g.data + n);
        continue;
      }
      auto& err = error_for(t, n);
      for (std::size_t i = 0; i < n; ++i) {
        buf.push_back(g.data[i] + err[i]);
        err[i] = 0.0f;
      }
    }
    buf.push_back(static_cast<float>(masks_.proposal(steps_, phase_)));
    bytes_.sent += 4 * buf.size();
    const std::size_t at = ride_along(buf);
    world.allreduce_sum(buf.data(), buf.size());
    ride_back(buf, at);
    const float inv = 1.0f / static_cast<float>(world.world_size());
    // The mean of the proposals: the same float on every rank, clamped into the valid range.
    const double target = std::clamp(static_cast<double>(buf[at - 1] * inv), 0.0, masks_.config().max_sparsity);
    std::vector<const float*> weights(grads.size(), nullptr), dense(grads.size(), nullptr);
    std::size_t k = 0;
    for (std::size_t t = 0; t < grads.size(); ++t) {
      float* g = grads[t].data;
      for (std::size_t i = 0; i < grads[t].size(); ++i) g[i] = buf[k++] * inv;
      if (masks_.sparsified(t)) {
        weights[t] = grads[t].weights;
        dense[t] = g;
      }
    }
    std::vector<std::vector<std::uint8_t>> before;
    for (std::size_t t = 0; t < grads.size(); ++t)
      before.push_back(masks_.sparsified(t) ? masks_.mask(t) : std::vector<std::uint8_t>{});
    last_ = masks_.update(steps_, target, weights, dense);
    for (std::size_t t = 0; t < grads.size(); ++t) {
      if (!masks_.sparsified(t)) continue;
      const auto& m = masks_.mask(t);
      float* g = grads[t].data;
      for (std::size_t i = 0; i < grads[t].size(); ++i)
        if (!(m[i] && before[t][i])) g[i] = 0.0f;
    }
  }

  /// round(keep x n) distinct entries (at least one), drawn from (seed, step, tensor): the same on
  /// every rank. All of them at keep >= 1.
  std::vector<std::uint32_t> random_subset(std::size_t n, double keep, std::size_t tensor) const {
    std::vector<std::uint32_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0u);
    if (keep >= 1.0 || n == 0) return idx;
    const std::size_t k =
        std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(keep * static_cast<double>(n))), 1, n);
    std::uint64_t state = rigl_tie_seed(seed_ ^ 0x5EED5EED5EED5EEDull, steps_, tensor);
    for (std::size_t i = 0; i < k; ++i) {  // partial Fisher-Yates
      const auto j = i + static_cast<std::size_t>(dra::elastic::detail::splitmix64(state) % (n - i));
      std::swap(idx[i], idx[j]);
    }
    idx.resize(k);
    std::sort(idx.begin(), idx.end());
    return idx;
  }

  rigl_masks masks_;
  mutable rigl_masks pending_;  ///< loaded, waiting for commit_extra
  std::uint64_t seed_;
  signals::training_phase phase_ = signals::training_phase::warmup;
  mask_update last_;
};

}  // namespace dra::compress
