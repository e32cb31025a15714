#pragma once
// Gradient compression codecs (DESIGN.md §3.7), torch-free, on float spans with Eigen.
//
//   codec            wire payload per rank per step            all-reduce compatible
//   fp32             4 n bytes                                  yes
//   powersgd(r)      4 r (rows + cols) per matrix (+ 4 n small)  yes (two all-reduces: P, then Q)
//   masked(mask)     4 k bytes (k kept entries, same on all)     yes: equals the masked dense all-reduce
//   topk(f)          8 k bytes (index + value), all-gathered      no (ranks pick different indices)
//   half(fp16|bf16)  2 n bytes                                  yes (summed in fp32 after decoding)
//
// Every lossy codec has error feedback: what a step did not send is added to the next step's
// gradient on that rank, so nothing is lost, only delayed (Seide et al. 2014; Karimireddy et al.
// 2019; PowerSGD, Vogels et al. 2019). A codec reduces a list of gradient tensors in place to
// (approximately) their mean over the world, through a `collective` passed in: dra's communicator
// in a job, threads in tests.
//
// State (error feedback, PowerSGD's warm-start Q, the step counter) serialises to bytes so it can
// travel in a resize's state handoff. The rule on a world change (docs/sage.md): Q and the step
// counter are the same on every rank and go to joiners from the leader; error feedback is a
// rank's own residual: survivors keep theirs, joiners start at zero, a leaver's (or a crashed
// rank's) residual is dropped: at most one step's unsent gradient of that rank, scaled by 1/world.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dra/error.hpp"

namespace dra::compress {

/// One gradient tensor: contiguous floats and their shape (row-major).
struct tensor_ref {
  float* data = nullptr;
  std::vector<std::int64_t> shape;
  std::size_t size() const {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
};

/// What a codec needs from the world. Sums are elementwise over ranks, in place.
class collective {
 public:
  virtual ~collective() = default;
  virtual int world_size() const = 0;
  virtual void allreduce_sum(float* data, std::size_t n) = 0;
  /// Every rank contributes `bytes` bytes; out receives world_size x bytes, rank order.
  virtual void allgather(const void* in, std::size_t bytes, void* out) = 0;
};

/// Bytes a codec handed to the collective (per rank), and what fp32 would have sent.
struct byte_counter {
  std::uint64_t sent = 0;
  std::uint64_t dense = 0;
  double ratio() const { return sent > 0 ? static_cast<double>(dense) / static_cast<double>(sent) : 1.0; }
};

namespace detail {
// Little serialisation helpers: a codec's state is a flat byte string with a tag and a version.
struct writer {
  std::vector<std::uint8_t> out;
  template <class T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  void put_str(const std::string& s) {
    put<std::uint32_t>(static_cast<std::uint32_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  void put_floats(const std::vector<float>& v) {
    put<std::uint64_t>(v.size());
    const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(float));
  }
};
struct reader {
  const std::vector<std::uint8_t>& in;
  std::size_t pos = 0;
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string get_str() {
    const auto n = get<std::uint32_t>();
    need(n);
    std::string s(in.begin() + static_cast<std::ptrdiff_t>(pos), in.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
    return s;
  }
  std::vector<float> get_floats() {
    const auto n = get<std::uint64_t>();
    need(n * sizeof(float));
    std::vector<float> v(n);
    std::memcpy(v.data(), in.data() + pos, n * sizeof(float));
    pos += n * sizeof(float);
    return v;
  }
  void need(std::size_t n) const {
    if (pos + n > in.size()) dra::detail::throw_invalid("state", "codec state truncated; pass the bytes save_state() returned");
  }
};
inline std::uint16_t to_fp16(float f) {
  // IEEE binary16, round to nearest even; overflow to inf, underflow through subnormals to 0.
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0u));
  if (mag >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds above 65504
  if (mag < 0x38800000u) {                                                       // subnormal or zero in fp16
    if (mag < 0x33000000u) return static_cast<std::uint16_t>(sign);
    const std::uint32_t m = (mag & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(mag >> 23);  // 14..24: value / 2^-24 = m x 2^(e - 126)
    std::uint32_t h = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = ((mag - 0x38000000u) >> 13);
  const std::uint32_t rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}
inline float from_fp16(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, x;
  if (exp == 0) {
    if (man == 0) {
      x = sign;
    } else {  // subnormal
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) man <<= 1, --exp;
      x = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (man << 13);
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline std::uint16_t to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // NaN stays NaN
  x += 0x7fffu + ((x >> 16) & 1u);                                                          // round to nearest even
  return static_cast<std::uint16_t>(x >> 16);
}
inline float from_bf16(std::uint16_t h) {
  const std::uint32_t x = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
}  // namespace detail

class gradient_codec {
 public:
  virtual ~gradient_codec() = default;
  virtual std::string name() const = 0;
  /// Reduces `grads` in place to their (approximate) mean over the world. Every rank calls it with
  /// tensors of the same shapes in the same order.
  virtual void reduce(std::vector<tensor_ref>& grads, collective& world) = 0;
  const byte_counter& bytes() const noexcept { return bytes_; }
  void reset_bytes() noexcept { bytes_ = {}; }
  std::int64_t steps() const noexcept { return steps_; }

  /// The codec's state as bytes (config tag, step, error feedback, warm start).
  std::vector<std::uint8_t> save_state() const {
    detail::writer w;
    w.put_str("dra.codec");
    w.put<std::uint32_t>(1);
    w.put_str(name());
    w.put<std::int64_t>(steps_);
    w.put<std::uint64_t>(error_.size());
    for (const auto& e : error_) w.put_floats(e);
    save_extra(w);
    return w.out;
  }
  /// Restores save_state()'s bytes. Throws std::invalid_argument (and changes nothing) when they
  /// come from another codec or version.
  void load_state(const std::vector<std::uint8_t>& bytes) {
    detail::reader r{bytes};
    if (r.get_str() != "dra.codec") dra::detail::throw_invalid("state", "not a dra codec state");
    if (const auto v = r.get<std::uint32_t>(); v != 1) dra::detail::throw_invalid("state", "codec state version " + std::to_string(v) + " unsupported (expected 1)");
    if (const auto n = r.get_str(); n != name())
      dra::detail::throw_invalid("state", "state of codec '" + n + "' cannot load into '" + name() + "'; build the same codec first");
    const auto steps = r.get<std::int64_t>();
    std::vector<std::vector<float>> error(r.get<std::uint64_t>());
    for (auto& e : error) e = r.get_floats();
    auto extra = load_extra(r);  // validates before anything changes
    steps_ = steps;
    error_ = std::move(error);
    commit_extra(std::move(extra));
  }
  /// Drops this rank's error feedback (a joiner's starting point). Warm start and step stay.
  void clear_error_feedback() {
    for (auto& e : error_) std::fill(e.begin(), e.end(), 0.0f);
  }

 protected:
  struct extra_state {
    std::vector<std::vector<float>> blocks;
  };
  virtual void save_extra(detail::writer&) const {}
  virtual extra_state load_extra(detail::reader&) const { return {}; }
  virtual void commit_extra(extra_state) {}

  /// The error-feedback buffer of tensor i, sized on first use.
  std::vector<float>& error_for(std::size_t i, std::size_t n) {
    if (error_.size() <= i) error_.resize(i + 1);
    if (error_[i].size() != n) {
      if (!error_[i].empty())
        dra::detail::throw_invalid("grads", "tensor " + std::to_string(i) + " has " + std::to_string(n) + " elements, the codec saw " +
                                                std::to_string(error_[i].size()) + "; reduce the same tensors every step");
      error_[i].assign(n, 0.0f);
    }
    return error_[i];
  }
  static void check_world(const collective& world) {
    if (world.world_size() < 1) dra::detail::throw_invalid("world", "world_size must be >= 1");
  }

  byte_counter bytes_;
  std::int64_t steps_ = 0;
  std::vector<std::vector<float>> error_;
};

/// Uncompressed: one fp32 all-reduce of everything (the baseline).
class fp32_codec final : public gradient_codec {
 public:
  std::string name() const override { return "fp32"; }
  void reduce(std::vector<tensor_ref>& grads, collective& world) override {
    check_world(world);
    const float inv = 1.0f / static_cast<float>(world.world_size());
    for (auto& g : grads) {
      const std::size_t n = g.size();
      world.allreduce_sum(g.data, n);
      for (std::size_t i = 0; i < n; ++i) g.data[i] *= inv;
      bytes_.sent += 4 * n;
      bytes_.dense += 4 * n;
    }
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
    check_world(world);
    const float inv = 1.0f / static_cast<float>(world.world_size());
    for (std::size_t t = 0; t < grads.size(); ++t) {
      auto& g = grads[t];
      const std::size_t n = g.size();
      auto& err = error_for(t, n);
      for (std::size_t i = 0; i < n; ++i) {
        const float want = g.data[i] + err[i];
        const float sent = round(want);
        err[i] = want - sent;
        g.data[i] = sent;
      }
      world.allreduce_sum(g.data, n);
      for (std::size_t i = 0; i < n; ++i) g.data[i] *= inv;
      bytes_.sent += 2 * n;
      bytes_.dense += 4 * n;
    }
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
/// (with error feedback) carried to later steps. The mask is set from outside (dynamic
/// sparsification derives it from all-reduced values), or drawn each step from a seed shared by all
/// ranks (random-k) when `keep_fraction` is given.
class masked_codec final : public gradient_codec {
 public:
  /// keep_fraction in (0, 1]: a fresh random mask per step from (seed, step); 0: use set_mask().
  explicit masked_codec(double keep_fraction = 0.0, std::uint64_t seed = 0, bool error_feedback = true)
      : keep_(keep_fraction), seed_(seed), feedback_(error_feedback) {
    if (!(keep_fraction >= 0.0 && keep_fraction <= 1.0))
      dra::detail::throw_invalid("keep_fraction", "must lie in [0, 1] (0: masks set with set_mask), got " + std::to_string(keep_fraction));
  }
  std::string name() const override { return "masked"; }
  /// Masks per tensor (1 keep, 0 drop); every rank must set the same ones.
  void set_masks(std::vector<std::vector<std::uint8_t>> masks) { masks_ = std::move(masks); }
  const std::vector<std::vector<std::uint8_t>>& masks() const noexcept { return masks_; }

  void reduce(std::vector<tensor_ref>& grads, collective& world) override {
    check_world(world);
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
          (*err)[i] = v;
        }
      }
      bytes_.dense += 4 * n;
    }
    if (!packed.empty()) world.allreduce_sum(packed.data(), packed.size());
    bytes_.sent += 4 * packed.size();
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
      const std::size_t k = std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(keep_ * static_cast<double>(n))));
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
    if (!(fraction > 0.0 && fraction <= 1.0)) dra::detail::throw_invalid("fraction", "must lie in (0, 1], got " + std::to_string(fraction));
  }
  std::string name() const override { return "topk"; }
  void reduce(std::vector<tensor_ref>& grads, collective& world) override {
    check_world(world);
    const int w = world.world_size();
    for (std::size_t t = 0; t < grads.size(); ++t) {
      auto& g = grads[t];
      const std::size_t n = g.size();
      auto& err = error_for(t, n);
      for (std::size_t i = 0; i < n; ++i) err[i] += g.data[i];
      const std::size_t k = std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(fraction_ * static_cast<double>(n))));
      std::vector<std::uint32_t> idx(n);
      std::iota(idx.begin(), idx.end(), 0u);
      std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k - 1), idx.end(), [&](std::uint32_t a, std::uint32_t b) {
        const float fa = std::fabs(err[a]), fb = std::fabs(err[b]);
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

/// PowerSGD (Vogels et al., NeurIPS'19): each matrix-shaped gradient M (rows x cols, the leading
/// dimension against the rest) is approximated by P Q^T of rank r with one power iteration per
/// step, warm-started from the previous step's Q; P and Q are all-reduced, so it works with
/// all-reduce. Tensors with fewer than `min_compression_rate` savings (biases, small layers) go
/// uncompressed, as in PyTorch's hook. Error feedback on the compressed matrices.
class powersgd_codec final : public gradient_codec {
 public:
  explicit powersgd_codec(int rank, std::uint64_t seed = 0, double min_compression_rate = 2.0)
      : rank_(rank), seed_(seed), min_rate_(min_compression_rate) {
    if (rank < 1) dra::detail::throw_invalid("rank", "must be >= 1, got " + std::to_string(rank));
    if (!(min_compression_rate >= 1.0)) dra::detail::throw_invalid("min_compression_rate", "must be >= 1");
  }
  std::string name() const override { return "powersgd"; }
  int rank() const noexcept { return rank_; }
  /// Changes the rank (compression follows the gradient noise scale); warm start restarts.
  void set_rank(int rank) {
    if (rank < 1) dra::detail::throw_invalid("rank", "must be >= 1, got " + std::to_string(rank));
    if (rank != rank_) q_.clear();
    rank_ = rank;
  }

  void reduce(std::vector<tensor_ref>& grads, collective& world) override {
    check_world(world);
    using mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const float inv = 1.0f / static_cast<float>(world.world_size());
    struct job {
      std::size_t t;
      Eigen::Index rows, cols;
      int r;
    };
    std::vector<job> low_rank;
    std::vector<std::size_t> plain;
    for (std::size_t t = 0; t < grads.size(); ++t) {
      const auto& g = grads[t];
      const std::size_t n = g.size();
      bytes_.dense += 4 * n;
      if (g.shape.size() < 2) {
        plain.push_back(t);
        continue;
      }
      const auto rows = static_cast<Eigen::Index>(g.shape[0]);
      const auto cols = static_cast<Eigen::Index>(n / static_cast<std::size_t>(g.shape[0]));
      const int r = static_cast<int>(std::min<Eigen::Index>(rank_, std::min(rows, cols)));
      if (static_cast<double>(n) < min_rate_ * static_cast<double>(r) * static_cast<double>(rows + cols)) {
        plain.push_back(t);
        continue;
      }
      low_rank.push_back({t, rows, cols, r});
    }
    // Uncompressed tensors: one packed fp32 all-reduce.
    if (!plain.empty()) {
      std::vector<float> buf;
      for (auto t : plain) buf.insert(buf.end(), grads[t].data, grads[t].data + grads[t].size());
      world.allreduce_sum(buf.data(), buf.size());
      bytes_.sent += 4 * buf.size();
      std::size_t k = 0;
      for (auto t : plain)
        for (std::size_t i = 0; i < grads[t].size(); ++i) grads[t].data[i] = buf[k++] * inv;
    }
    if (low_rank.empty()) {
      ++steps_;
      return;
    }
    if (q_.size() < grads.size()) q_.resize(grads.size());
    // M += error; P = M Q (all P's packed into one all-reduce).
    std::vector<mat> m(low_rank.size());
    std::size_t p_total = 0, q_total = 0;
    for (std::size_t j = 0; j < low_rank.size(); ++j) {
      const auto& b = low_rank[j];
      auto& err = error_for(b.t, grads[b.t].size());
      m[j] = Eigen::Map<mat>(grads[b.t].data, b.rows, b.cols) + Eigen::Map<mat>(err.data(), b.rows, b.cols);
      auto& q = q_[b.t];
      if (q.size() != static_cast<std::size_t>(b.cols * b.r)) q = initial_q(b.t, b.cols, b.r);
      p_total += static_cast<std::size_t>(b.rows * b.r);
      q_total += static_cast<std::size_t>(b.cols * b.r);
    }
    std::vector<float> pbuf(p_total);
    std::size_t off = 0;
    for (std::size_t j = 0; j < low_rank.size(); ++j) {
      const auto& b = low_rank[j];
      Eigen::Map<mat> p(pbuf.data() + off, b.rows, b.r);
      p.noalias() = m[j] * Eigen::Map<const mat>(q_[b.t].data(), b.cols, b.r);
      off += static_cast<std::size_t>(b.rows * b.r);
    }
    world.allreduce_sum(pbuf.data(), pbuf.size());
    bytes_.sent += 4 * pbuf.size();
    // Orthonormalise P (thin QR), then Q = M^T P, all-reduced: the mean's Q.
    std::vector<float> qbuf(q_total);
    off = 0;
    std::size_t qoff = 0;
    for (std::size_t j = 0; j < low_rank.size(); ++j) {
      const auto& b = low_rank[j];
      Eigen::Map<mat> p(pbuf.data() + off, b.rows, b.r);
      orthonormalise(p);
      Eigen::Map<mat> q(qbuf.data() + qoff, b.cols, b.r);
      q.noalias() = m[j].transpose() * p;
      off += static_cast<std::size_t>(b.rows * b.r);
      qoff += static_cast<std::size_t>(b.cols * b.r);
    }
    world.allreduce_sum(qbuf.data(), qbuf.size());
    bytes_.sent += 4 * qbuf.size();
    // Output: P Q^T with Q the mean over ranks (the same on every rank); this rank's error is what
    // its own M lost in that approximation (PowerSGD's error feedback).
    off = 0;
    qoff = 0;
    for (std::size_t j = 0; j < low_rank.size(); ++j) {
      const auto& b = low_rank[j];
      Eigen::Map<mat> p(pbuf.data() + off, b.rows, b.r);
      Eigen::Map<mat> q(qbuf.data() + qoff, b.cols, b.r);
      q *= inv;
      Eigen::Map<mat> out(grads[b.t].data, b.rows, b.cols);
      out.noalias() = p * q.transpose();
      auto& err = error_for(b.t, grads[b.t].size());
      Eigen::Map<mat>(err.data(), b.rows, b.cols) = m[j] - out;
      q_[b.t].assign(q.data(), q.data() + q.size());  // warm start for the next step
      off += static_cast<std::size_t>(b.rows * b.r);
      qoff += static_cast<std::size_t>(b.cols * b.r);
    }
    ++steps_;
  }

 protected:
  void save_extra(detail::writer& w) const override {
    w.put<std::int32_t>(rank_);
    w.put<std::uint64_t>(q_.size());
    for (const auto& q : q_) w.put_floats(q);
  }
  extra_state load_extra(detail::reader& r) const override {
    const auto rank = r.get<std::int32_t>();
    if (rank != rank_)
      dra::detail::throw_invalid("state", "PowerSGD state of rank " + std::to_string(rank) + " cannot load into rank " +
                                              std::to_string(rank_) + "; build the codec with the same rank");
    extra_state e;
    e.blocks.resize(r.get<std::uint64_t>());
    for (auto& b : e.blocks) b = r.get_floats();
    return e;
  }
  void commit_extra(extra_state e) override { q_ = std::move(e.blocks); }

 private:
  template <class M>
  static void orthonormalise(M& p) {
    // Modified Gram-Schmidt on the columns (r is small). A column that is (numerically) in the span
    // of the previous ones is zeroed, not normalised: its remainder is rounding noise, and a
    // normalised noise vector is not orthogonal to the others (the rank of the gradient was lower).
    for (Eigen::Index c = 0; c < p.cols(); ++c) {
      const float before = p.col(c).norm();
      for (Eigen::Index k = 0; k < c; ++k) p.col(c) -= p.col(k).dot(p.col(c)) * p.col(k);
      const float norm = p.col(c).norm();
      if (norm > 1e-4f * before && norm > 1e-30f) p.col(c) /= norm;
      else p.col(c).setZero();
    }
  }
  std::vector<float> initial_q(std::size_t tensor, Eigen::Index cols, int r) const {
    // Same on every rank: seeded by (seed, tensor index).
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + tensor + 1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(static_cast<std::size_t>(cols * r));
    for (auto& v : q) v = normal(rng);
    return q;
  }

  int rank_;
  std::uint64_t seed_;
  double min_rate_;
  std::vector<std::vector<float>> q_;  // per tensor index (empty: not low-rank)
};

/// Builds a codec from a spec string: "fp32", "fp16", "bf16", "powersgd:4", "topk:0.01",
/// "random:0.1" (masked, random-k from a shared seed), "masked" (masks from set_masks).
inline std::unique_ptr<gradient_codec> make_codec(const std::string& spec, std::uint64_t seed = 0) {
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  auto number = [&](double fallback) {
    if (arg.empty()) return fallback;
    try {
      std::size_t used = 0;
      const double v = std::stod(arg, &used);
      if (used != arg.size()) throw std::invalid_argument(arg);
      return v;
    } catch (const std::exception&) {
      dra::detail::throw_invalid("codec", "'" + spec + "': '" + arg + "' is not a number");
    }
  };
  if (kind == "fp32") return std::make_unique<fp32_codec>();
  if (kind == "fp16") return std::make_unique<half_codec>(half_codec::format::fp16);
  if (kind == "bf16") return std::make_unique<half_codec>(half_codec::format::bf16);
  if (kind == "powersgd") return std::make_unique<powersgd_codec>(static_cast<int>(number(4.0)), seed);
  if (kind == "topk") return std::make_unique<topk_codec>(number(0.01));
  if (kind == "random") return std::make_unique<masked_codec>(number(0.1), seed);
  if (kind == "masked") return std::make_unique<masked_codec>(0.0, seed);
  dra::detail::throw_invalid("codec", "unknown codec '" + spec +
                                          "'; use fp32, fp16, bf16, powersgd:<rank>, topk:<fraction>, random:<keep fraction> or masked");
}

}  // namespace dra::compress
