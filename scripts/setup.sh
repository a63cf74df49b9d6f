#!/usr/bin/env bash
# Installs every Debian package that hopwise's build, tests and examples need. Idempotent: when all are there
# it only checks (well under a second).
set -euo pipefail

packages=(
  build-essential cmake pkg-config   # compilers and the build
  openmpi-bin libopenmpi-dev         # MPI: processes, host-memory transport, the peer we benchmark against
  libfmt-dev                         # formatting of messages and tables
  nlohmann-json3-dev                 # the topology JSON format
  libhwloc-dev                       # discovery of the live machine: CPUs, NUMA, PCIe, NICs
  libgtest-dev                       # the test suite
  libucx-dev                         # UCX: the host-memory transport of jobs without MPI (torchrun)
  python3-torch                      # torchrun (launches jobs without MPI), PyTorch DDP as the peer
  libtorch-dev pybind11-dev python3-dev  # the PyTorch backend (a c10d ProcessGroup extension) is built against them
  python3-pytest                     # the Python tests of that backend
  libopenblas0-pthread               # torch's BLAS: without it Debian's torch multiplies with the reference BLAS
  libopenblas-dev                    # the same BLAS under the C++ training job's matrix products (Eigen calls it)
  libgloo-dev                        # Gloo: the second peer in hopwise-bench's allreduce tables
  libeigen3-dev                      # the training job's matrix products
  zlib1g-dev                         # reading the gzip-compressed IDX files
  dataset-fashion-mnist              # the training job's data
  iproute2 util-linux                # scripts/local-cluster.sh: namespaces, veths, bridge, tbf (ip, tc, unshare)
  iptables libnetfilter-queue-dev    # its link delay: packets queued to hopwise-link-delay (no netem here)
  python3-matplotlib                 # scripts/plot.py: the charts of benchmarks, training metrics and traces
  graphviz                           # hopwise-topo export --format png|svg renders the DOT through it
  prometheus                         # promtool: the tests check the monitor's metrics file with it
  dpkg-dev                           # cpack -G DEB reads the packages' dependencies off the binaries (dpkg-shlibdeps)
  stress-ng                          # scripts/test-stress.sh: the suite beside a CPU load
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
