#include "checkpoint.h"

#include <fmt/core.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "hopwise/common/error.h"

namespace hopwise::examples {

namespace {
constexpr const char* kMagic = "hopwise-train_mnist-checkpoint";
}

std::string checkpoint_path(const std::string& base, int rank) { return fmt::format("{}.rank{}", base, rank); }

// Written to PATH.rankR.tmp and renamed: a job stopped while saving leaves the last checkpoint whole.
void save_checkpoint(const std::string& base, int rank, const Checkpoint& c, const float* params,
                     const float* velocity, std::size_t count) {
  const std::string path = checkpoint_path(base, rank), tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write the checkpoint " + tmp);
    out << kMagic << " 1\n" << c.epochs_done << ' ' << c.ranks << ' ' << count << '\n' << c.averaging << '\n';
    out.write(reinterpret_cast<const char*>(params), static_cast<std::streamsize>(count * sizeof(float)));
    out.write(reinterpret_cast<const char*>(velocity), static_cast<std::streamsize>(count * sizeof(float)));
    if (!out) throw Error("writing the checkpoint " + tmp + " failed (disk full?)");
  }
  std::filesystem::rename(tmp, path);
}

Checkpoint load_checkpoint(const std::string& base, int rank, float* params, float* velocity, std::size_t count) {
  const std::string path = checkpoint_path(base, rank);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("--resume: cannot read {} (each rank reads its own PATH.rankR)", path));
  std::string magic, line;
  int version = 0;
  std::size_t n = 0;
  Checkpoint c;
  in >> magic >> version >> c.epochs_done >> c.ranks >> n;
  std::getline(in, line);
  std::getline(in, c.averaging);
  if (!in || magic != kMagic || version != 1)
    throw InvalidArgument(fmt::format("--resume: {} is not a train_mnist checkpoint", path));
  if (n != count)
    throw InvalidArgument(fmt::format("--resume: {} holds {} parameters, this model has {}; resume with the same "
                                      "--hidden",
                                      path, n, count));
  in.read(reinterpret_cast<char*>(params), static_cast<std::streamsize>(count * sizeof(float)));
  in.read(reinterpret_cast<char*>(velocity), static_cast<std::streamsize>(count * sizeof(float)));
  if (!in) throw InvalidArgument(fmt::format("--resume: {} is cut short", path));
  return c;
}

}  // namespace hopwise::examples
