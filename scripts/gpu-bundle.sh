#!/usr/bin/env bash
# Packs the GPU checks for a GPU machine that lacks the project's packages (a bare, offline machine): the GPU test
# binaries and gpu-codec-bench built here (CUDA architecture $1, default 90: H100/H200) into .gpu-bundle/, with the
# shared libraries they load that such a machine may lack (fmt, hwloc, Open MPI's libraries, libstdc++, the CUDA
# runtime), and Open MPI's runtime (mpirun, its components, PMIx, what they load) as mpi-runtime.tar.gz, for a
# machine without mpirun. cuBLAS and NCCL stay behind (hundreds of MB): the GPU machine's own toolkit or its Python
# wheels (nvidia-cublas, nvidia-nccl) provide them; gpu-check.sh --prebuilt finds them.
#   scripts/gpu-bundle.sh [ARCH]      then, there: scripts/gpu-check.sh --prebuilt .gpu-bundle
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
# Open MPI's runtime at its own paths: the packages' files as installed (links kept) and every library they load
# (glibc's and the driver's aside), so that unpacked into / it runs where no Open MPI is installed.
stage=build-bundle/mpi-runtime
rm -rf "$stage"
mkdir -p "$stage"
for pkg in openmpi-bin libopenmpi3 openmpi-common libpmix2; do dpkg -L "$pkg"; done |
  grep -v -E '^/usr/share/(doc|man|lintian)/' | while read -r f; do
    if [ -L "$f" ] || [ -f "$f" ]; then mkdir -p "$stage$(dirname "$f")"; cp -a "$f" "$stage$f"; fi
  done
find "$stage" -type f | while read -r f; do [ "$(head -c4 "$f" | tail -c3)" = ELF ] && ldd "$f" 2>/dev/null; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libstdc\+\+|libgcc_s)\.so' |
  while read -r lib; do
    dir=$(readlink -f "$(dirname "$lib")")
    mkdir -p "$stage$dir"
    cp -L "$lib" "$stage$dir/$(basename "$lib")"
  done
ln -sf orterun "$stage/usr/bin/mpirun"
tar -czf .gpu-bundle/mpi-runtime.tar.gz -C "$stage" .
echo "$arch" > .gpu-bundle/cuda-arch
du -sh .gpu-bundle
echo "gpu-bundle: .gpu-bundle/ is ready (git-ignored); carry it to the GPU machine and run scripts/gpu-check.sh --prebuilt .gpu-bundle"
