#!/usr/bin/env bash
# Installs every Debian package that hopwise's build, tests and examples need, and the Python environment of
# hopwise.torch: a virtual environment with torch 2.x from PyPI (frontends/torch/requirements.txt), made once per
# machine at $HOPWISE_VENV (default ~/.cache/hopwise/venv) and reused. Idempotent: when all is there it only checks.
set -euo pipefail

packages=(
  build-essential cmake pkg-config   # compilers and the build
  ccache                             # compiler cache: the wheel's build (tests/wheel_check.sh) reuses build/'s objects
  openmpi-bin libopenmpi-dev         # MPI: processes, host-memory transport, the peer we benchmark against
  libfmt-dev                         # formatting of messages and tables
  nlohmann-json3-dev                 # the topology JSON format
  libhwloc-dev                       # discovery of the live machine: CPUs, NUMA, PCIe, NICs
  libgtest-dev                       # the test suite
  libucx-dev                         # UCX: the host-memory transport of jobs without MPI (torchrun)
  python3-venv python3-dev           # the virtual environment with torch (below); Python's headers for the extension
  libopenblas-dev                    # the same BLAS under the C++ training job's matrix products (Eigen calls it)
  libgloo-dev                        # Gloo: the second peer in hopwise-bench's allreduce tables
  libeigen3-dev                      # the training job's matrix products
  zlib1g-dev                         # reading the gzip-compressed IDX files
  dataset-fashion-mnist              # the training job's data
  iproute2 util-linux                # scripts/local-cluster.sh: namespaces, veths, bridge, tbf (ip, tc, unshare)
  iptables libnetfilter-queue-dev    # its link delay: packets queued to hopwise-link-delay (no netem here)
  slurmctld slurmd slurm-client munge  # scripts/local-slurm.sh: a real Slurm on the emulated hosts (srun, sbatch)
  python3-matplotlib                 # scripts/plot.py: the charts of benchmarks, training metrics and traces
  graphviz                           # hopwise-topo export --format png|svg renders the DOT through it
  prometheus                         # promtool: the tests check the monitor's metrics file with it
  dpkg-dev                           # cpack -G DEB reads the packages' dependencies off the binaries (dpkg-shlibdeps)
  stress-ng                          # scripts/test-stress.sh: the suite beside a CPU load
  libsimgrid-dev                     # SimGrid: ranks simulated on platforms of many hosts (hopwise_sim, its tests)
  clang-format                       # the house style: scripts/format.sh, checked by .ci/run
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: Debian packages done"
fi

# The virtual environment: torchrun, torch's DDP and Gloo (the peers), and what hopwise.torch is built against.
# Debian's Python underneath (its headers are python3-dev). Remade only when the requirements changed.
here=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$here/scripts/venv.sh" --path)
requirements="$here/frontends/torch/requirements.txt"
stamp="$venv/.hopwise-requirements"
if ! cmp -s "$requirements" "$stamp" || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: making the Python environment $venv (torch from PyPI: several GB, a few minutes, once per machine)"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$stamp"
  echo "setup: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)') in $venv"
fi
