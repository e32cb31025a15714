#pragma once
// PowerSGD, the low-rank codec that works with all-reduce (see codecs.hpp for the others).
#include "dra/compress/codec.hpp"

namespace dra::compress {

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
    check_inputs(grads, world);
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
      if (g.shape.size() < 2 || n == 0) {  // a vector, a scalar or no elements (a zero dimension)
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
    // M += error; P = M Q. One all-reduce carries the uncompressed tensors, every P and what rides
    // along (reduce_with): a round trip fewer than sending the small tensors apart.
    if (q_.size() < grads.size()) q_.resize(grads.size());
    std::vector<mat> m(low_rank.size());
    std::size_t q_total = 0;
    std::vector<float> pbuf;
    for (auto t : plain) pbuf.insert(pbuf.end(), grads[t].data, grads[t].data + grads[t].size());
    const std::size_t p_start = pbuf.size();
    bytes_.sent += 4 * p_start;
    for (std::size_t j = 0; j < low_rank.size(); ++j) {
      const auto& b = low_rank[j];
      auto& err = error_for(b.t, grads[b.t].size());
      m[j] = Eigen::Map<mat>(grads[b.t].data, b.rows, b.cols) + Eigen::Map<mat>(err.data(), b.rows, b.cols);
      auto& q = q_[b.t];
      if (q.size() != static_cast<std::size_t>(b.cols * b.r)) q = initial_q(b.t, b.cols, b.r);
      q_total += static_cast<std::size_t>(b.cols * b.r);
    }
    std::size_t off = p_start;
    for (std::size_t j = 0; j < low_rank.size(); ++j) {
      const auto& b = low_rank[j];
      pbuf.resize(off + static_cast<std::size_t>(b.rows * b.r));
      Eigen::Map<mat> p(pbuf.data() + off, b.rows, b.r);
      p.noalias() = m[j] * Eigen::Map<const mat>(q_[b.t].data(), b.cols, b.r);
      off += static_cast<std::size_t>(b.rows * b.r);
    }
    bytes_.sent += 4 * (pbuf.size() - p_start);
    const std::size_t at = ride_along(pbuf);
    world.allreduce_sum(pbuf.data(), pbuf.size());
    ride_back(pbuf, at);
    pbuf.resize(at);
    std::size_t k = 0;
    for (auto t : plain)
      for (std::size_t i = 0; i < grads[t].size(); ++i) grads[t].data[i] = pbuf[k++] * inv;
    if (low_rank.empty()) {
      ++steps_;
      return;
    }
    // Orthonormalise P (thin QR), then Q = M^T P, all-reduced: the mean's Q.
    std::vector<float> qbuf(q_total);
    off = p_start;
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
    off = p_start;
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
      for (auto& e : err) e = carried(e);
      // Warm start for the next step; a non-finite Q (a NaN gradient on some rank: Q is the mean, so
      // every rank sees it) would stay non-finite for good, so the seeded start is taken again.
      if (q.allFinite())
        q_[b.t].assign(q.data(), q.data() + q.size());
      else
        q_[b.t].clear();
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
    e.blocks.resize(r.count(sizeof(std::uint64_t)));
    for (auto& b : e.blocks) b = r.get_floats();
    return e;
  }
  void commit_extra(extra_state e) override { q_ = std::move(e.blocks); }
  void remap_extra(const std::vector<std::int64_t>& from, const std::vector<std::vector<std::int64_t>>&) override {
    // A warm start is kept for the same parameter (its size is checked at the next reduce: a
    // Q of another size is drawn afresh); a tensor new to the codec starts from the seeded Q.
    std::vector<std::vector<float>> q(from.size());
    for (std::size_t i = 0; i < from.size(); ++i)
      if (from[i] >= 0 && static_cast<std::size_t>(from[i]) < q_.size()) q[i] = q_[static_cast<std::size_t>(from[i])];
    q_ = std::move(q);
  }

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
      if (norm > 1e-4f * before && norm > 1e-30f)
        p.col(c) /= norm;
      else
        p.col(c).setZero();
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

}  // namespace dra::compress
