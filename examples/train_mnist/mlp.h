// A multilayer perceptron (ReLU hidden layers, softmax cross-entropy) on Eigen, whose parameters and gradients
// live in flat buffers laid out in reverse layer order, bias before weights: the order backward produces them,
// so that every bucket of the gradient reducer is one contiguous view.
#pragma once

// GCC 12 warns "'__Y' may be used uninitialized" inside its own AVX-512 intrinsics (_mm512_undefined_ps) once
// Eigen's packet code is inlined here; the warning is the compiler's and Eigen's, not this code's.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Dense>
#pragma GCC diagnostic pop
#else
#include <Eigen/Dense>
#endif

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace hopwise::examples {

class Mlp {
 public:
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
  using MatMap = Eigen::Map<Matrix>;
  using VecMap = Eigen::Map<Eigen::VectorXf>;

  struct Tensor {
    std::string name;
    std::size_t offset, count;
    // As a row-major matrix (what PowerSGD factors): a weight's column-major out x in is in x out; a bias 1 x out.
    std::size_t rows, cols;
  };

  // sizes = {784, 1024, 1024, 10}; weights drawn from He-normal with `seed`. Each weight gradient is handed out
  // as `weight_chunks` column blocks (tensors "layerL.weight[k]"), each complete as soon as its own product is
  // done, so that communication of one block overlaps computing the next, the first layer's (last to finish)
  // included. 1: one tensor per weight.
  Mlp(std::vector<int> sizes, std::uint64_t seed, int weight_chunks = 1);

  int layers() const { return static_cast<int>(sizes_.size()) - 1; }
  // Parameters in forward order (W1, b1, W2, b2, ...): what a reducer registers.
  const std::vector<Tensor>& tensors() const { return tensors_; }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  float* velocity() { return velocity_.data(); }  // SGD momentum, local to the rank (a checkpoint keeps it)
  std::size_t parameter_count() const { return params_.size(); }

  // Forward on a column-major batch x (in_features x n); returns mean loss. The gradient backward computes is the
  // mean loss's times grad_scale.
  float forward(const float* x, const std::uint8_t* labels, int n, float grad_scale = 1);
  // Backward of the last forward; calls on_ready(tensor index) as each gradient is complete (last layer first),
  // so that the caller can hand it to the reducer while the earlier layers are still being computed.
  void backward(const std::function<void(int)>& on_ready, const std::function<void(int, bool)>& on_layer = {});
  // Predicted classes of a batch.
  void predict(const float* x, int n, std::vector<int>& out);
  // SGD with momentum on the (averaged) gradients.
  void sgd_step(float lr, float momentum);

 private:
  // 64-byte aligned, so that every run vectorizes the same way: where a buffer's alignment followed the heap's
  // state (which the communicator's threads change), the same step's gradients differed in their last bits.
  using Buffer = std::vector<float, Eigen::aligned_allocator<float>>;
  MatMap W(int l, Buffer& buf);
  VecMap b(int l, Buffer& buf);
  // Tensor indices: layer l's weight chunks, then its bias.
  int w_index(int l, int chunk = 0) const { return l * (chunks_ + 1) + chunk; }
  int b_index(int l) const { return l * (chunks_ + 1) + chunks_; }
  // Columns [first, last) of layer l's weight that chunk k covers.
  std::pair<int, int> chunk_cols(int l, int k) const;

  std::vector<int> sizes_;
  int chunks_ = 1;
  std::vector<Tensor> tensors_;
  Buffer params_, grads_, velocity_;
  std::vector<Matrix> acts_, pre_;  // activations (input included) and pre-activations of the last forward
  Matrix delta_;
  std::vector<std::uint8_t> labels_;
  int n_ = 0;
};

}  // namespace hopwise::examples
