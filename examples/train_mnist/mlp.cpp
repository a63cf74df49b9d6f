#include "mlp.h"

#include <algorithm>
#include <cmath>

namespace hopwise::examples {

Mlp::Mlp(std::vector<int> sizes, std::uint64_t seed, int weight_chunks)
    : sizes_(std::move(sizes)), chunks_(std::max(1, weight_chunks)) {
  // Offsets: reverse layer order, bias first (b_L, W_L, ..., b_1, W_1).
  std::size_t total = 0;
  const int L = layers();
  std::vector<std::size_t> w_off(static_cast<std::size_t>(L)), b_off(static_cast<std::size_t>(L));
  for (int l = L - 1; l >= 0; --l) {
    b_off[static_cast<std::size_t>(l)] = total;
    total += static_cast<std::size_t>(sizes_[static_cast<std::size_t>(l) + 1]);
    w_off[static_cast<std::size_t>(l)] = total;
    total += static_cast<std::size_t>(sizes_[static_cast<std::size_t>(l) + 1]) *
             static_cast<std::size_t>(sizes_[static_cast<std::size_t>(l)]);
  }
  for (int l = 0; l < L; ++l) {
    const auto out = static_cast<std::size_t>(sizes_[static_cast<std::size_t>(l) + 1]);
    const std::string name = "layer" + std::to_string(l + 1) + ".weight";
    for (int k = 0; k < chunks_; ++k) {
      // Column block of the column-major out x in weight: contiguous, out * columns floats.
      const auto [c0, c1] = chunk_cols(l, k);
      const auto cols = static_cast<std::size_t>(c1 - c0);
      tensors_.push_back({chunks_ == 1 ? name : name + "[" + std::to_string(k) + "]",
                          w_off[static_cast<std::size_t>(l)] + static_cast<std::size_t>(c0) * out, out * cols, cols,
                          out});
    }
    tensors_.push_back({"layer" + std::to_string(l + 1) + ".bias", b_off[static_cast<std::size_t>(l)], out, 1, out});
  }
  params_.assign(total, 0.0f);
  grads_.assign(total, 0.0f);
  velocity_.assign(total, 0.0f);
  std::mt19937_64 rng(seed);
  for (int l = 0; l < L; ++l) {
    std::normal_distribution<float> dist(0.0f,
                                         std::sqrt(2.0f / static_cast<float>(sizes_[static_cast<std::size_t>(l)])));
    auto w = W(l, params_);
    for (Eigen::Index j = 0; j < w.cols(); ++j)
      for (Eigen::Index i = 0; i < w.rows(); ++i) w(i, j) = dist(rng);
  }
  acts_.resize(static_cast<std::size_t>(L) + 1);
  pre_.resize(static_cast<std::size_t>(L));
}

std::pair<int, int> Mlp::chunk_cols(int l, int k) const {
  const int in = sizes_[static_cast<std::size_t>(l)];
  const int chunks = std::min(chunks_, in);
  if (k >= chunks) return {in, in};  // more chunks than columns: the extra ones are empty
  return {in * k / chunks, in * (k + 1) / chunks};
}

Mlp::MatMap Mlp::W(int l, Buffer& buf) {
  const Tensor& t = tensors_[static_cast<std::size_t>(w_index(l, 0))];
  return MatMap(buf.data() + t.offset, sizes_[static_cast<std::size_t>(l) + 1], sizes_[static_cast<std::size_t>(l)]);
}

Mlp::VecMap Mlp::b(int l, Buffer& buf) {
  const Tensor& t = tensors_[static_cast<std::size_t>(b_index(l))];
  return VecMap(buf.data() + t.offset, sizes_[static_cast<std::size_t>(l) + 1]);
}

float Mlp::forward(const float* x, const std::uint8_t* labels, int n, float grad_scale) {
  n_ = n;
  labels_.assign(labels, labels + n);
  acts_[0] = Eigen::Map<const Matrix>(x, sizes_[0], n);
  const int L = layers();
  for (int l = 0; l < L; ++l) {
    pre_[static_cast<std::size_t>(l)].noalias() = W(l, params_) * acts_[static_cast<std::size_t>(l)];
    pre_[static_cast<std::size_t>(l)].colwise() += b(l, params_);
    if (l + 1 < L) acts_[static_cast<std::size_t>(l) + 1] = pre_[static_cast<std::size_t>(l)].cwiseMax(0.0f);
  }
  // Softmax cross-entropy; delta_ = d(mean loss)/d(logits).
  Matrix& z = pre_[static_cast<std::size_t>(L) - 1];
  delta_.resize(z.rows(), z.cols());
  double loss = 0;
  for (int j = 0; j < n; ++j) {
    const float m = z.col(j).maxCoeff();
    auto e = (z.col(j).array() - m).exp();
    const float s = e.sum();
    delta_.col(j) = e / s;
    loss += -(z(labels[j], j) - m - std::log(s));
    delta_(labels[j], j) -= 1.0f;
  }
  delta_ /= static_cast<float>(n);
  if (grad_scale != 1) delta_ *= grad_scale;
  return static_cast<float>(loss / n);
}

void Mlp::backward(const std::function<void(int)>& on_ready, const std::function<void(int, bool)>& on_layer) {
  const int L = layers();
  for (int l = L - 1; l >= 0; --l) {
    if (on_layer) on_layer(l, true);
    b(l, grads_) = delta_.rowwise().sum();
    on_ready(b_index(l));
    // dW = delta * a^T, one column block at a time (the last block first: buckets follow reverse order).
    auto dw = W(l, grads_);
    const Matrix& a = acts_[static_cast<std::size_t>(l)];
    for (int k = chunks_ - 1; k >= 0; --k) {
      const auto [c0, c1] = chunk_cols(l, k);
      if (c1 > c0) dw.middleCols(c0, c1 - c0).noalias() = delta_ * a.middleRows(c0, c1 - c0).transpose();
      on_ready(w_index(l, k));
    }
    if (l > 0) {
      Matrix up = W(l, params_).transpose() * delta_;
      delta_ = up.cwiseProduct((pre_[static_cast<std::size_t>(l) - 1].array() > 0.0f).cast<float>().matrix());
    }
    if (on_layer) on_layer(l, false);
  }
}

void Mlp::predict(const float* x, int n, std::vector<int>& out) {
  Matrix a = Eigen::Map<const Matrix>(x, sizes_[0], n);
  const int L = layers();
  for (int l = 0; l < L; ++l) {
    Matrix z = W(l, params_) * a;
    z.colwise() += b(l, params_);
    a = l + 1 < L ? Matrix(z.cwiseMax(0.0f)) : z;
  }
  out.resize(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) a.col(j).maxCoeff(&out[static_cast<std::size_t>(j)]);
}

void Mlp::sgd_step(float lr, float momentum) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    velocity_[i] = momentum * velocity_[i] + grads_[i];
    params_[i] -= lr * velocity_[i];
  }
}

}  // namespace hopwise::examples
