#include "mnist.h"

#include <fmt/core.h>
#include <zlib.h>

#include <filesystem>

#include "hopwise/common/env.h"
#include "hopwise/common/error.h"

namespace hopwise::examples {

namespace {

std::vector<std::uint8_t> read_gz(const std::string& path) {
  if (!std::filesystem::exists(path))
    throw Error(
        fmt::format("{} is missing; install the Debian package dataset-fashion-mnist "
                    "(apt-get install dataset-fashion-mnist, or run scripts/setup.sh) or set HOPWISE_MNIST_DIR",
                    path));
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw Error(fmt::format("cannot open {}", path));
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  const bool bad = n < 0;
  gzclose(f);
  if (bad) throw Error(fmt::format("{} is not a readable gzip file", path));
  return out;
}

std::uint32_t be32(const std::vector<std::uint8_t>& b, std::size_t off, const std::string& path) {
  if (off + 4 > b.size()) throw Error(fmt::format("{}: truncated IDX header", path));
  return (std::uint32_t{b[off]} << 24) | (std::uint32_t{b[off + 1]} << 16) | (std::uint32_t{b[off + 2]} << 8) |
         b[off + 3];
}

}  // namespace

std::string default_mnist_dir() { return env::get_or("HOPWISE_MNIST_DIR", "/usr/share/datasets/fashion-mnist"); }

Dataset load_fashion_mnist(const std::string& dir, const std::string& prefix) {
  const std::string ipath = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string lpath = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  const auto img = read_gz(ipath);
  const auto lab = read_gz(lpath);
  if (be32(img, 0, ipath) != 0x00000803) throw Error(fmt::format("{}: not an IDX3 image file (magic)", ipath));
  if (be32(lab, 0, lpath) != 0x00000801) throw Error(fmt::format("{}: not an IDX1 label file (magic)", lpath));
  const std::size_t n = be32(img, 4, ipath);
  Dataset d;
  d.rows = static_cast<int>(be32(img, 8, ipath));
  d.cols = static_cast<int>(be32(img, 12, ipath));
  const std::size_t px = static_cast<std::size_t>(d.rows) * static_cast<std::size_t>(d.cols);
  if (be32(lab, 4, lpath) != n) throw Error(fmt::format("{} and {} disagree on the number of items", ipath, lpath));
  if (img.size() < 16 + n * px || lab.size() < 8 + n) throw Error(fmt::format("{}: truncated data", ipath));
  d.images.resize(n * px);
  for (std::size_t i = 0; i < n * px; ++i) d.images[i] = img[16 + i] / 255.0f;
  d.labels.assign(lab.begin() + 8, lab.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  return d;
}

}  // namespace hopwise::examples
