#!/usr/bin/env bash
# The GPU checks in one run, on a machine with an NVIDIA GPU and the project's packages (scripts/setup.sh):
#   1. builds the CUDA targets for the GPU present (build-gpu/, CMAKE_CUDA_ARCHITECTURES=native);
#   2. runs the GPU tests (ctest label cuda): every reduction and codec kernel against the CPU version on fresh
#      random data of awkward sizes, PowerSGD against the CPU PowerSGD, an NCCL communicator of one rank under
#      mpirun, and the gradient reducer on device gradients. A GPU test that skips here is a failure;
#   3. times each kernel against a device-to-device copy of the same bytes (gpu-codec-bench): GB/s and % of copy;
#   4. times allreduce of device buffers, one rank per GPU: NCCL, hopwise's NCCL ring, fp16/int8 compressed, and
#      MPI_Allreduce staged through host memory, beside a device copy (gpu-allreduce-bench).
# Finishes in under 8 minutes on an H200 (16 cores). Logs and tables go to $OUT (when set) or build-gpu/gpu-check/.
#   scripts/gpu-check.sh [--sizes 1M,16M,64M,256M] [--reps 20] [--prebuilt DIR] [--torch | --torch-only]
# --prebuilt DIR: no build; run the binaries scripts/gpu-bundle.sh packed (for a GPU machine without the project's
# packages or a network): its libraries first on the loader path, then CUDA's from /usr/local/cuda and from the
# Python wheels (nvidia-cublas, nvidia-nccl) where the machine has them. The NCCL tests need mpirun there.
# --torch: also hopwise.torch on CUDA tensors (ctest torch_cuda: tests/python/cuda_worker.py, one rank; and
# torch_cuda_placement: cuda_placement_worker.py, the averagers, allreduce and FSDP2 host-staged, 2 ranks). With
# --prebuilt it unpacks DIR/dev-packages.tar.gz into / (adding files only, as mpi-runtime.tar.gz), builds the
# extension alone (build-gpu-torch/; CUDA for this GPU, or $HOPWISE_CUDA_ARCH) against this machine's python3 and
# its torch, with NCCL from its wheel, and runs the test as ctest does (tests/spawn_ranks.sh 1,
# PYTHONPATH=build-gpu-torch/python, 300 s); a skip (77) is a failure here. --torch-only: that alone.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes=1M,16M,64M,256M
reps=20
prebuilt=
torch=
torch_only=
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --prebuilt) prebuilt=$2; shift 2 ;;
    --torch) torch=1; shift ;;
    --torch-only) torch=1; torch_only=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# DIR as given, or relative to the repository's root; absolute from here on.
if [ -n "$prebuilt" ]; then
  prebuilt=$(cd "$prebuilt" && pwd) || { echo "gpu-check: --prebuilt $prebuilt: no such folder" >&2; exit 2; }
fi
out=${OUT:-build-gpu/gpu-check}
mkdir -p "$out"
start=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - start )) s)"; }

step "GPU"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi failed); run it on a GPU machine" >&2
  exit 2
fi
export PATH=/usr/local/cuda/bin:$PATH
. scripts/mpi-env.sh

ld_path_before=${LD_LIBRARY_PATH:-}

# Unpacks one of the bundle's tarballs into /, adding files only: none of the machine's is replaced. GNU tar before
# 1.35 refuses --no-overwrite-dir beside --skip-old-files; there the folders it holds take the tarball's modes.
unpack_into_root() {
  local keep_dirs=--no-overwrite-dir
  tar -tzf "$1" --skip-old-files --no-overwrite-dir >/dev/null 2>&1 || keep_dirs=
  tar -xzf "$1" -C / --skip-old-files --keep-directory-symlink $keep_dirs && ldconfig
}

# hopwise.torch on CUDA tensors (--torch with --prebuilt): the extension built here against this machine's python3
# and torch (NCCL from its wheel, the one torch loads), then tests/python/cuda_worker.py run as ctest runs torch_cuda.
# Runs on the loader path it found: the bundle's libraries (an older libstdc++ among them) stay out of it.
torch_cuda_prebuilt() {
  local py build=build-gpu-torch pyinc nccl_root
  local -a args
  py=$(command -v python3) || { echo "gpu-check: no python3 on this machine" >&2; return 1; }
  [ -f "$prebuilt/dev-packages.tar.gz" ] ||
    { echo "gpu-check: $prebuilt/dev-packages.tar.gz not found; make it with scripts/gpu-bundle.sh" >&2; return 1; }
  step "hopwise.torch: the bundle's -dev packages (adds files only: none of the machine's is replaced)"
  unpack_into_root "$prebuilt/dev-packages.tar.gz" || return 1
  # tests/spawn_ranks.sh picks its port with /usr/bin/python3.
  if [ ! -x /usr/bin/python3 ]; then
    echo "gpu-check: no /usr/bin/python3 (tests/spawn_ranks.sh uses it): linking it to $py"
    ln -s "$py" /usr/bin/python3
  fi
  "$py" - <<'PY' | tee "$out/torch-versions.txt"
import importlib.metadata as md, platform, torch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "?"
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"NCCL {nccl} as torch loads it (wheel nvidia-nccl-cu13 {version('nvidia-nccl-cu13')}), "
      f"GPU {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none visible to torch'}")
PY
  args=(-DCMAKE_BUILD_TYPE=Release -DHOPWISE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${HOPWISE_CUDA_ARCH:-native}" -DHOPWISE_TORCH=ON
        -DHOPWISE_PYTHON="$py" -DHOPWISE_BUILD_TESTS=OFF -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
  command -v ninja >/dev/null && args+=(-G Ninja)
  # NCCL: the wheel's (torch loads that one; the toolkit may have none), headers and library of the same release.
  nccl_root=$("$py" -c 'import glob, os, nvidia; print(next(os.path.dirname(os.path.dirname(h)) for b in nvidia.__path__ for h in sorted(glob.glob(os.path.join(b, "nccl", "include", "nccl.h")))))' 2>/dev/null || true)
  if [ -n "$nccl_root" ] && [ -f "$nccl_root/lib/libnccl.so.2" ]; then
    args+=(-DHOPWISE_NCCL_LIBRARY="$nccl_root/lib/libnccl.so.2" -DHOPWISE_NCCL_INCLUDE_DIR="$nccl_root/include")
  fi
  # Python's headers: this python3's, else the bundle's of the same minor version (python3-dev is often missing).
  if ! "$py" -c 'import os, sys, sysconfig; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    pyinc=$prebuilt/python-include/python$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ -f "$pyinc/Python.h" ] || { echo "gpu-check: $py has no headers (Python.h) and the bundle has no $pyinc" >&2; return 1; }
    echo "gpu-check: $py has no headers (Python.h): using the bundle's $pyinc"
    args+=(-DPython3_INCLUDE_DIR="$pyinc")
  fi
  step "hopwise.torch: configure and build against this python3's torch (CUDA for this GPU; the extension alone)"
  cmake -S . -B "$build" "${args[@]}" >"$out/torch-configure.log" 2>&1 || { tail -40 "$out/torch-configure.log"; return 1; }
  grep -E 'hopwise: (PyTorch|CUDA)' "$out/torch-configure.log" || true
  grep -q "PyTorch backend's CUDA tensors ON" "$out/torch-configure.log" ||
    { echo "gpu-check: hopwise.torch would be built without CUDA (see $out/torch-configure.log)" >&2; return 1; }
  cmake --build "$build" -j"$(nproc)" --target hopwise_torch_c >"$out/torch-build.log" 2>&1 ||
    { grep -E -B2 -A8 'error|Error' "$out/torch-build.log" | head -80; tail -20 "$out/torch-build.log"; return 1; }
  tail -1 "$out/torch-build.log"

  torch_worker torch_cuda 1 tests/python/cuda_worker.py 'CUDA checks ok' || return 1
  torch_worker torch_cuda_placement 2 tests/python/cuda_placement_worker.py 'CUDA placement ok' || return 1
}

# One of the torch CUDA workers as ctest runs it: NAME RANKS SCRIPT LINE (the line every passing run prints).
torch_worker() {
  local name=$1 ranks=$2 script=$3 line=$4 rc=0
  step "$name: $script, $ranks rank(s) (as ctest runs it)"
  PYTHONPATH=$PWD/$build/python timeout 300 tests/spawn_ranks.sh "$ranks" "$py" "$script" 2>&1 |
    tee "$out/$name.log" || rc=${PIPESTATUS[0]}
  case "$rc" in
    0) grep -q "$line" "$out/$name.log" ||
         { echo "gpu-check: $name FAILED: it exited 0 without its '$line' line" >&2; return 1; }
       echo "gpu-check: $name passed: $(grep "$line" "$out/$name.log" | head -1)" ;;
    77) echo "gpu-check: $name SKIPPED (exit 77) although a GPU is visible: a failure here" >&2; return 1 ;;
    124) echo "gpu-check: $name FAILED: timed out after 300 s" >&2; return 1 ;;
    *) echo "gpu-check: $name FAILED (exit $rc; see $out/$name.log)" >&2; return 1 ;;
  esac
}

tests_rc=0
torch_rc=0
if [ -z "$prebuilt" ]; then
  step "build (CUDA for this GPU)"
  targets="test_cuda_reduce test_cuda_codecs test_cuda_powersgd test_nccl_communicator test_device_reducer gpu-codec-bench gpu-allreduce-bench"
  torch_args=()
  if [ -n "$torch" ]; then
    targets="$targets hopwise_torch_c"
    torch_args=(-DHOPWISE_TORCH=ON)
  fi
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DHOPWISE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native \
    "${torch_args[@]}" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  # shellcheck disable=SC2086
  cmake --build build-gpu -j"$(nproc)" --target $targets >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  bin=build-gpu/bin

  # torch_cuda is among the cuda label where hopwise.torch is built (HOPWISE_TORCH: AUTO finds the environment).
  set +e
  if [ -n "$torch_only" ]; then
    step "GPU tests (ctest -R torch_cuda)"
    ctest --test-dir build-gpu -R '^torch_cuda' --output-on-failure --timeout 300 2>&1 | tee "$out/tests.log"
  else
    step "GPU tests (ctest -L cuda)"
    ctest --test-dir build-gpu -L cuda --output-on-failure -j4 --timeout 300 2>&1 | tee "$out/tests.log"
  fi
  tests_rc=${PIPESTATUS[0]}
  set -e
  for name in torch_cuda torch_cuda_placement; do
    if [ -n "$torch" ] && ! grep -q "$name .*Passed" "$out/tests.log"; then
      echo "gpu-check: $name did not pass (see $out/tests.log)" >&2
      torch_rc=1
    fi
  done
else
  [ -d "$prebuilt/bin" ] || { echo "gpu-check: $prebuilt/bin not found; make it with scripts/gpu-bundle.sh" >&2; exit 2; }
  bin=$prebuilt/bin
  if ! command -v mpirun >/dev/null && [ -f "$prebuilt/mpi-runtime.tar.gz" ]; then
    step "Open MPI's runtime from the bundle (adds files only: none of the machine's is replaced)"
    unpack_into_root "$prebuilt/mpi-runtime.tar.gz"
    # One host: shared memory between ranks, no network transports to probe.
    export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
    mpirun --version | head -1
  fi
  wheel_libs=$(python3 -c 'import glob, os, nvidia; print(":".join(d for b in nvidia.__path__ for d in sorted(glob.glob(os.path.join(b, "*", "lib")))))' 2>/dev/null || true)
  export LD_LIBRARY_PATH="$prebuilt/lib:/usr/local/cuda/lib64:${wheel_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

  : >"$out/tests.log"
  if [ -z "$torch_only" ]; then
    step "GPU tests (prebuilt binaries)"
    for t in test_cuda_reduce test_cuda_codecs test_cuda_powersgd; do
      echo "-- $t" | tee -a "$out/tests.log"
      timeout 300 "$bin/$t" 2>&1 | tee -a "$out/tests.log" || tests_rc=1
    done
    for t in test_nccl_communicator test_device_reducer; do
      echo "-- $t (mpirun -np 1)" | tee -a "$out/tests.log"
      if ! command -v mpirun >/dev/null; then
        echo "gpu-check: no mpirun on this machine: $t not run" | tee -a "$out/tests.log"
        tests_rc=1
        continue
      fi
      timeout 300 mpirun --allow-run-as-root -np 1 -x LD_LIBRARY_PATH "$bin/$t" 2>&1 | tee -a "$out/tests.log" || tests_rc=1
    done
  fi
  if [ -n "$torch" ]; then
    LD_LIBRARY_PATH=$ld_path_before torch_cuda_prebuilt || torch_rc=1
  fi
fi
# Cases that need several ranks skip at one rank by design; a case that finds no GPU is a failure here.
skipped=$(grep -c -E '\*\*\*Skipped|Not Run|needs a CUDA GPU' "$out/tests.log" || true)
if [ "$skipped" != 0 ]; then
  echo "gpu-check: $skipped GPU tests skipped although a GPU is visible (see $out/tests.log)" >&2
  tests_rc=1
fi

if [ -z "$torch_only" ]; then
  step "kernels against a device-to-device copy (gpu-codec-bench)"
  timeout 240 "$bin/gpu-codec-bench" --sizes "$sizes" --reps "$reps" --csv "$out/kernels.csv" | tee "$out/kernels.md"

  step "allreduce of device buffers, one rank per GPU (gpu-allreduce-bench)"
  gpus=$(nvidia-smi -L | wc -l)
  if command -v mpirun >/dev/null; then
    timeout 180 mpirun --allow-run-as-root -np "$gpus" -x LD_LIBRARY_PATH "$bin/gpu-allreduce-bench" -b 1M -e 256M -f 4 \
      | tee "$out/allreduce.md" || tests_rc=1
  else
    echo "gpu-check: no mpirun on this machine: gpu-allreduce-bench not run"
  fi
fi

step "done"
if [ "$torch_rc" != 0 ]; then
  echo "gpu-check: FAILED: hopwise.torch on CUDA (torch_cuda) did not pass (logs in $out)"
  exit 1
fi
if [ "$tests_rc" != 0 ]; then
  echo "gpu-check: FAILED: GPU tests failed (see $out/tests.log)"
  exit 1
fi
if [ -n "$torch_only" ]; then
  echo "gpu-check: passed: hopwise.torch built here and torch_cuda ran and passed on this GPU"
else
  echo "gpu-check: passed: every GPU test ran and passed${torch:+ (torch_cuda too)}; kernel table in $out/kernels.md"
fi
