#!/usr/bin/env bash
# Packs the GPU checks for a GPU machine that lacks the project's packages (a bare, offline machine): the GPU test
# binaries and gpu-codec-bench built here (CUDA architecture $1, default 90: H100/H200) into .gpu-bundle/, with the
# shared libraries they load that such a machine may lack (fmt, hwloc, Open MPI's libraries, libstdc++, the CUDA
# runtime), and Open MPI's runtime (mpirun, its components, PMIx, what they load) as mpi-runtime.tar.gz, for a
# machine without mpirun. cuBLAS and NCCL stay behind (hundreds of MB): the GPU machine's own toolkit or its Python
# wheels (nvidia-cublas, nvidia-nccl) provide them; gpu-check.sh --prebuilt finds them. For hopwise.torch, which
# must be built there against that machine's torch and Python: the -dev packages its build needs (headers, CMake and
# pkg-config files, the libraries they link) as dev-packages.tar.gz, and Python's headers (python-include/).
#   scripts/gpu-bundle.sh [ARCH]      then, there: scripts/gpu-check.sh --prebuilt .gpu-bundle [--torch]
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-90}
bins="test_cuda_reduce test_cuda_codecs test_cuda_powersgd test_nccl_communicator test_device_reducer gpu-codec-bench gpu-allreduce-bench"
cmake -S . -B build-bundle -DCMAKE_BUILD_TYPE=Release -DHOPWISE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  >/dev/null
# shellcheck disable=SC2086
cmake --build build-bundle -j"$(nproc)" --target $bins
rm -rf .gpu-bundle
mkdir -p .gpu-bundle/bin .gpu-bundle/lib
for b in $bins; do cp "build-bundle/bin/$b" .gpu-bundle/bin/; done
# Every library the binaries load, except glibc's own, the driver's, cuBLAS and NCCL.
for b in .gpu-bundle/bin/*; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libcublas|libcublasLt|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" .gpu-bundle/lib/; done
# Debian packages at their own paths: the packages' files as installed (links kept), the files their links point to
# outside them (a -dev package's libfoo.so -> the runtime's libfoo.so.N) and every library those load (glibc's, the
# driver's, libstdc++ and libgcc aside), so that unpacked into / they work where the packages are not installed.
stage_packages() {
  local stage=$1
  shift
  rm -rf "$stage"
  mkdir -p "$stage"
  for pkg in "$@"; do dpkg -L "$pkg"; done |
    grep -v -E '^/usr/share/(doc|man|lintian)/|\.a$' | while read -r f; do
      if [ -L "$f" ] || [ -f "$f" ]; then mkdir -p "$stage$(dirname "$f")"; cp -a "$f" "$stage$f"; fi
    done
  # Links to files outside the packages: each link of the chain at its own path, then the file at its end.
  find "$stage" -type l | while read -r l; do
    f=${l#"$stage"}
    while [ -L "$f" ]; do
      t=$(readlink "$f")
      case "$t" in /*) ;; *) t=$(dirname "$f")/$t ;; esac
      if [ -e "$stage$t" ] || [ -L "$stage$t" ] || ! { [ -e "$t" ] || [ -L "$t" ]; }; then break; fi
      mkdir -p "$stage$(dirname "$t")"
      cp -a "$t" "$stage$t"
      f=$t
    done
  done
  find "$stage" -type f | while read -r f; do
    if [ "$(head -c4 "$f" | tail -c3 | tr -d '\0')" = ELF ]; then ldd "$f" 2>/dev/null || true; fi
  done |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libstdc\+\+|libgcc_s)\.so' |
    while read -r lib; do
      dir=$(readlink -f "$(dirname "$lib")")
      mkdir -p "$stage$dir"
      [ -e "$stage$dir/$(basename "$lib")" ] || cp -L "$lib" "$stage$dir/$(basename "$lib")"
    done
}
# Open MPI's runtime, for a machine without mpirun.
stage=build-bundle/mpi-runtime
stage_packages "$stage" openmpi-bin libopenmpi3 openmpi-common libpmix2
ln -sf orterun "$stage/usr/bin/mpirun"
tar -czf .gpu-bundle/mpi-runtime.tar.gz -C "$stage" .
# What building hopwise.torch there needs (scripts/gpu-check.sh --torch builds it against that machine's torch):
# the -dev packages configure asks for (fmt, nlohmann_json, hwloc and UCX through pkg-config, Open MPI through mpicc,
# Eigen and zlib for the examples) and pkg-config itself, with the runtime libraries their links name.
stage=build-bundle/dev-packages
stage_packages "$stage" libfmt-dev nlohmann-json3-dev libhwloc-dev libopenmpi-dev libucx-dev libeigen3-dev zlib1g-dev \
  pkgconf pkgconf-bin libpkgconf3
ln -sf mpicc.openmpi "$stage/usr/bin/mpicc"  # Debian's alternative (mpicc.openmpi is in mpi-runtime.tar.gz)
tar -czf .gpu-bundle/dev-packages.tar.gz -C "$stage" .
# Python's headers, for a machine whose python3 lacks them (python3-dev): pyenv's of the GPU machine's minor version
# ($HOPWISE_BUNDLE_PYTHON, default 3.12), where this machine has them.
py=${HOPWISE_BUNDLE_PYTHON:-3.12}
for inc in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$py".*/include/python"$py"; do
  if [ -f "$inc/Python.h" ]; then
    mkdir -p .gpu-bundle/python-include
    cp -a "$inc" .gpu-bundle/python-include/
    break
  fi
done
echo "$arch" > .gpu-bundle/cuda-arch
du -sh .gpu-bundle
echo "gpu-bundle: .gpu-bundle/ is ready (git-ignored); carry it to the GPU machine and run scripts/gpu-check.sh --prebuilt .gpu-bundle"
