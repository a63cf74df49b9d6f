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
#   scripts/gpu-check.sh [--sizes 1M,16M,64M,256M] [--reps 20] [--prebuilt DIR]
# --prebuilt DIR: no build; run the binaries scripts/gpu-bundle.sh packed (for a GPU machine without the project's
# packages or a network): its libraries first on the loader path, then CUDA's from /usr/local/cuda and from the
# Python wheels (nvidia-cublas, nvidia-nccl) where the machine has them. The NCCL tests need mpirun there.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes=1M,16M,64M,256M
reps=20
prebuilt=
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --prebuilt) prebuilt=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

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

tests_rc=0
if [ -z "$prebuilt" ]; then
  step "build (CUDA for this GPU)"
  targets="test_cuda_reduce test_cuda_codecs test_cuda_powersgd test_nccl_communicator test_device_reducer gpu-codec-bench gpu-allreduce-bench"
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DHOPWISE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native \
    >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  # shellcheck disable=SC2086
  cmake --build build-gpu -j"$(nproc)" --target $targets >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  bin=build-gpu/bin

  step "GPU tests (ctest -L cuda)"
  set +e
  ctest --test-dir build-gpu -L cuda --output-on-failure -j4 --timeout 300 2>&1 | tee "$out/tests.log"
  tests_rc=${PIPESTATUS[0]}
  set -e
else
  [ -d "$prebuilt/bin" ] || { echo "gpu-check: $prebuilt/bin not found; make it with scripts/gpu-bundle.sh" >&2; exit 2; }
  bin=$prebuilt/bin
  if ! command -v mpirun >/dev/null && [ -f "$prebuilt/mpi-runtime.tar.gz" ]; then
    step "Open MPI's runtime from the bundle (adds files only: none of the machine's is replaced)"
    tar -xzf "$prebuilt/mpi-runtime.tar.gz" -C / --skip-old-files --keep-directory-symlink --no-overwrite-dir
    ldconfig
    # One host: shared memory between ranks, no network transports to probe.
    export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
    mpirun --version | head -1
  fi
  wheel_libs=$(python3 -c 'import glob, os, nvidia; print(":".join(d for b in nvidia.__path__ for d in sorted(glob.glob(os.path.join(b, "*", "lib")))))' 2>/dev/null || true)
  export LD_LIBRARY_PATH="$prebuilt/lib:/usr/local/cuda/lib64:${wheel_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

  step "GPU tests (prebuilt binaries)"
  : >"$out/tests.log"
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
# Cases that need several ranks skip at one rank by design; a case that finds no GPU is a failure here.
skipped=$(grep -c -E '\*\*\*Skipped|Not Run|needs a CUDA GPU' "$out/tests.log" || true)
if [ "$skipped" != 0 ]; then
  echo "gpu-check: $skipped GPU tests skipped although a GPU is visible (see $out/tests.log)" >&2
  tests_rc=1
fi

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

step "done"
if [ "$tests_rc" != 0 ]; then
  echo "gpu-check: FAILED: GPU tests failed (see $out/tests.log)"
  exit 1
fi
echo "gpu-check: passed: every GPU test ran and passed; kernel table in $out/kernels.md"
