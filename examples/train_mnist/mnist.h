// Fashion-MNIST from the IDX files of Debian's dataset-fashion-mnist (gzip-compressed, read with zlib).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hopwise::examples {

struct Dataset {
  int rows = 0, cols = 0;
  std::vector<float> images;         // n * rows * cols, scaled to [0, 1]
  std::vector<std::uint8_t> labels;  // n
  std::size_t size() const { return labels.size(); }
};

// Where the Debian package installs the files; HOPWISE_MNIST_DIR overrides.
std::string default_mnist_dir();

// Loads "<dir>/<prefix>-images-idx3-ubyte.gz" and "<dir>/<prefix>-labels-idx1-ubyte.gz" (prefix "train" or
// "t10k"). Throws hopwise::Error naming the file, and the package to install when it is missing.
Dataset load_fashion_mnist(const std::string& dir, const std::string& prefix);

}  // namespace hopwise::examples
