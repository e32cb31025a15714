#pragma once
// Gradient compression codecs, torch-free, on float spans with Eigen: fp32, PowerSGD, masked and
// random-mask sparse, top-k, fp16/bf16. Every lossy codec has error feedback (what a step did not
// send is added to that rank's next gradient), and its state serialises to bytes so it can travel
// in a resize's state handoff. Wire payloads, which codecs work with all-reduce, and the rule on a
// world change: docs/design/sustainable.md.
#include "dra/compress/codec.hpp"
#include "dra/compress/powersgd.hpp"
#include "dra/compress/rigl.hpp"

namespace dra::compress {

/// Uncompressed: one fp32 all-reduce of everything, packed (the baseline).
class fp32_codec final : public gradient_codec {
 public:
  std::string name() const override { return "fp32"; }
  void reduce(std::vector<tensor_ref>& grads, collective& world) override {
    check_inputs(grads, world);
    std::vector<float> buf;
    for (const auto& g : grads) buf.insert(buf.end(), g.data, g.data + g.size());
    bytes_.sent += 4 * buf.size();
    bytes_.dense += 4 * buf.size();
    const std::size_t at = ride_along(buf);
    world.allreduce_sum(buf.data(), buf.size());
    ride_back(buf, at);
    const float inv = 1.0f / static_cast<float>(world.world_size());
    std::size_t k = 0;
    for (auto& g : grads)
      for (std::size_t i = 0; i < g.size(); ++i) g.data[i] = buf[k++] * inv;
    ++steps_;
  }
};

/// Reduced precision: (gradient + error) rounded to fp16 or bf16 on the wire. The collective sums
/// fp32 values (Gloo has no bf16 sum everywhere), so the wire format is emulated: what is summed is
/// exactly the rounded values, and the bytes counted are 2 per element.
class half_codec final : public gradient_codec {
 public:
  enum class format { fp16, bf16 };
  explicit half_codec(format f) : format_(f) {}
  std::string name() const override { return format_ == format::fp16 ? "fp16" : "bf16"; }
  void reduce(std::vector<tensor_ref>& grads, collective& world) override {
    check_inputs(grads, world);
    std::vector<float> buf;
    for (std::size_t t = 0; t < grads.size(); ++t) {
      const auto& g = grads[t];
      const std::size_t n = g.size();
      auto& err = error_for(t, n);
      for (std::size_t i = 0; i < n; ++i) {
        const float want = g.data[i] + err[i];
        const float sent = round(want);
        err[i] = carried(want - sent);
        buf.push_back(sent);
      }
      bytes_.sent += 2 * n;
      bytes_.dense += 4 * n;
    }
    const std::size_t at = ride_along(buf);
    world.allreduce_sum(buf.data(), buf.size());
    ride_back(buf, at);
    const float inv = 1.0f / static_cast<float>(world.world_size());
    std::size_t k = 0;
    for (auto& g : grads)
      for (std::size_t i = 0; i < g.size(); ++i) g.data[i] = buf[k++] * inv;
    ++steps_;
  }
  float round(float x) const {
    return format_ == format::fp16 ? detail::from_fp16(detail::to_fp16(x)) : detail::from_bf16(detail::to_bf16(x));
  }

 private:
  format format_;
};

/// Sparse with a mask every rank agrees on: only the kept entries travel, packed; the result on
/// kept entries is exactly the masked dense all-reduce; dropped entries are zero in the output and
/// (with error feedback) carried to later steps. The mask is drawn each step from a seed shared by
/// all ranks (random-k, spec "random:<keep fraction>") when `keep_fraction` is given, else set by
/// hand with set_masks (C++ only; the spec "masked" is rigl.hpp's codec, whose masks are RigL's).
class masked_codec final : public gradient_codec {
 public:
  /// keep_fraction in (0, 1]: a fresh random mask per step from (seed, step); 0: use set_mask().
  explicit masked_codec(double keep_fraction = 0.0, std::uint64_t seed = 0, bool error_feedback = true)
      : keep_(keep_fraction), seed_(seed), feedback_(error_feedback) {
    if (!(keep_fraction >= 0.0 && keep_fraction <= 1.0))
      dra::detail::throw_invalid(
          "keep_fraction", "must lie in [0, 1] (0: masks set with set_mask), got " + std::to_string(keep_fraction));
  }
  std::string name() const override { return keep_ > 0.0 ? "random" : "set_masks"; }
  /// Masks per tensor (1 keep, 0 drop); every rank must set the same ones.
  void set_masks(std::vector<std::vector<std::uint8_t>> masks) { masks_ = std::move(masks); }
  const std::vector<std::vector<std::uint8_t>>& masks() const noexcept { return masks_; }

  void reduce(std::vector<tensor_ref>& grads, collective& world) override {
    check_inputs(grads, world);
    if (keep_ > 0.0) check_indexable(grads);  // the random masks' index lists
    if (keep_ == 0.0 && masks_.size() != grads.size())
      dra::detail::throw_invalid("masks", std::to_string(masks_.size()) + " masks for " + std::to_string(grads.size()) +
                                              " tensors; call set_masks with one mask per tensor first");
    std::size_t total = 0;
    for (auto& g : grads) total += g.size();
    std::vector<float> packed;
    packed.reserve(total);
    std::vector<std::vector<std::uint8_t>> step_masks;
    if (keep_ > 0.0) step_masks = random_masks(grads);
    const auto& masks = keep_ > 0.0 ? step_masks : masks_;
    for (std::size_t t = 0; t < grads.size(); ++t) {
      const std::size_t n = grads[t].size();
      if (masks[t].size() != n)
        dra::detail::throw_invalid("masks", "mask " + std::to_string(t) + " has " + std::to_string(masks[t].size()) +
                                                " entries for a tensor of " + std::to_string(n));
      float* g = grads[t].data;
      std::vector<float>* err = feedback_ ? &error_for(t, n) : nullptr;
      for (std::size_t i = 0; i < n; ++i) {
        const float v = g[i] + (err ? (*err)[i] : 0.0f);
        if (masks[t][i]) {
          packed.push_back(v);
          if (err) (*err)[i] = 0.0f;
        } else if (err) {
          (*err)[i] = carried(v);
        }
      }
      bytes_.dense += 4 * n;
    }
    bytes_.sent += 4 * packed.size();
    const std::size_t at = ride_along(packed);
    if (!packed.empty()) world.allreduce_sum(packed.data(), packed.size());
    ride_back(packed, at);
    const float inv = 1.0f / static_cast<float>(world.world_size());
    std::size_t k = 0;
    for (std::size_t t = 0; t < grads.size(); ++t) {
      float* g = grads[t].data;
      for (std::size_t i = 0; i < grads[t].size(); ++i) g[i] = masks[t][i] ? packed[k++] * inv : 0.0f;
    }
    ++steps_;
  }

 private:
  std::vector<std::vector<std::uint8_t>> random_masks(const std::vector<tensor_ref>& grads) const {
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(steps_));
    std::vector<std::vector<std::uint8_t>> out;
    for (const auto& g : grads) {
      const std::size_t n = g.size();
      if (n == 0) {  // nothing to keep (a zero dimension)
        out.emplace_back();
        continue;
      }
      const std::size_t k =
          std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(keep_ * static_cast<double>(n))), 1, n);
      std::vector<std::uint32_t> idx(n);
      std::iota(idx.begin(), idx.end(), 0u);
      for (std::size_t i = 0; i < k; ++i) {  // partial Fisher-Yates: the same k indices on every rank
        std::uniform_int_distribution<std::size_t> pick(i, n - 1);
        std::swap(idx[i], idx[pick(rng)]);
      }
      std::vector<std::uint8_t> m(n, 0);
      for (std::size_t i = 0; i < k; ++i) m[idx[i]] = 1;
      out.push_back(std::move(m));
    }
    return out;
  }
  double keep_;
  std::uint64_t seed_;
  bool feedback_;
  std::vector<std::vector<std::uint8_t>> masks_;
};

/// Top-k by magnitude of (gradient + error) per tensor; ranks pick different indices, so the
/// (index, value) pairs are all-gathered and summed.
class topk_codec final : public gradient_codec {
 public:
  explicit topk_codec(double fraction) : fraction_(fraction) {
    if (!(fraction > 0.0 && fraction <= 1.0))
      dra::detail::throw_invalid("fraction", "must lie in (0, 1], got " + std::to_string(fraction));
  }
  std::string name() const override { return "topk"; }
  static float magnitude(float v) noexcept { return std::isnan(v) ? INFINITY : std::fabs(v); }
  void reduce(std::vector<tensor_ref>& grads, collective& world) override {
    check_inputs(grads, world);
    check_indexable(grads);
    const int w = world.world_size();
    for (std::size_t t = 0; t < grads.size(); ++t) {
      auto& g = grads[t];
      const std::size_t n = g.size();
      auto& err = error_for(t, n);
      if (n == 0) continue;  // nothing to send (a zero dimension); every rank has the same shapes
      for (std::size_t i = 0; i < n; ++i) err[i] += g.data[i];
      const std::size_t k =
          std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(fraction_ * static_cast<double>(n))), 1, n);
      std::vector<std::uint32_t> idx(n);
      std::iota(idx.begin(), idx.end(), 0u);
      std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k - 1), idx.end(),
                       [&](std::uint32_t a, std::uint32_t b) {
                         // A NaN ranks as the largest (a strict weak order; it is sent now).
                         const float fa = magnitude(err[a]), fb = magnitude(err[b]);
                         return fa > fb || (fa == fb && a < b);
                       });
      struct pair {
        std::uint32_t index;
        float value;
      };
      std::vector<pair> mine(k);
      for (std::size_t i = 0; i < k; ++i) {
        mine[i] = {idx[i], err[idx[i]]};
        err[idx[i]] = 0.0f;
      }
      for (std::size_t i = 0; i < n; ++i) err[i] = carried(err[i]);
      std::vector<pair> all(k * static_cast<std::size_t>(w));
      world.allgather(mine.data(), k * sizeof(pair), all.data());
      std::fill(g.data, g.data + n, 0.0f);
      for (const auto& p : all) g.data[p.index] += p.value;
      const float inv = 1.0f / static_cast<float>(w);
      for (std::size_t i = 0; i < n; ++i) g.data[i] *= inv;
      bytes_.sent += k * sizeof(pair);
      bytes_.dense += 4 * n;
    }
    ++steps_;
  }

 private:
  double fraction_;
};

/// Builds a codec from a spec string: "fp32", "fp16", "bf16", "powersgd:4" (a whole rank >= 1; 4
/// when omitted), "topk:0.01" (a fraction in (0, 1]; 0.01 when omitted), "random:0.1" (random-k from
/// a shared seed; a keep fraction in (0, 1], 0.1 when omitted), "masked" or "masked:<max sparsity>"
/// (sparse training's sync, rigl.hpp, configured by `sparsity`; the number overrides its
/// max_sparsity). Anything else, an argument to a codec that takes none, an empty or non-finite
/// number, or a fractional rank throws std::invalid_argument naming the spec and the fix.
inline std::unique_ptr<gradient_codec> make_codec(const std::string& spec, std::uint64_t seed = 0,
                                                  rigl_config sparsity = {}) {
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  auto bad = [&](const std::string& problem) { dra::detail::throw_invalid("codec", "'" + spec + "': " + problem); };
  auto number = [&](double fallback) {
    if (colon == std::string::npos) return fallback;
    if (arg.empty()) bad("no number after ':'; write '" + kind + "' for the default or '" + kind + ":<number>'");
    double v = 0.0;
    try {
      std::size_t used = 0;
      v = std::stod(arg, &used);
      if (used != arg.size()) throw std::invalid_argument(arg);
    } catch (const std::exception&) {
      bad("'" + arg + "' is not a number");
    }
    if (!std::isfinite(v)) bad("'" + arg + "' is not a finite number");
    return v;
  };
  if (kind == "fp32" || kind == "fp16" || kind == "bf16") {
    if (colon != std::string::npos) bad(kind + " takes no argument; write '" + kind + "'");
    if (kind == "fp32") return std::make_unique<fp32_codec>();
    return std::make_unique<half_codec>(kind == "fp16" ? half_codec::format::fp16 : half_codec::format::bf16);
  }
  if (kind == "powersgd") {
    const double r = number(4.0);
    if (!(r >= 1.0 && r <= 65536.0) || r != std::floor(r))
      bad("the rank must be a whole number in [1, 65536], got " + arg + "; e.g. powersgd:4");
    return std::make_unique<powersgd_codec>(static_cast<int>(r), seed);
  }
  if (kind == "topk") {
    const double f = number(0.01);
    if (!(f > 0.0 && f <= 1.0)) bad("the fraction kept must lie in (0, 1], got " + arg + "; e.g. topk:0.01");
    return std::make_unique<topk_codec>(f);
  }
  if (kind == "random") {
    const double f = number(0.1);
    if (!(f > 0.0 && f <= 1.0)) bad("the keep fraction must lie in (0, 1], got " + arg + "; e.g. random:0.1");
    return std::make_unique<masked_codec>(f, seed);
  }
  if (kind == "masked") {
    if (colon != std::string::npos) sparsity.max_sparsity = number(0.9);
    try {
      return std::make_unique<masked_sync_codec>(sparsity, seed);
    } catch (const std::invalid_argument& e) {
      bad(e.what());
    }
  }
  dra::detail::throw_invalid("codec",
                             "unknown codec '" + spec +
                                 "'; use fp32, fp16, bf16, powersgd:<rank>, topk:<fraction>, random:<keep fraction> or "
                                 "masked[:<max sparsity>]");
}

}  // namespace dra::compress
