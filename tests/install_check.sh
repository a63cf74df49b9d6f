#!/usr/bin/env bash
# hopwise installed as a user installs it, every step checked (ctest: install_and_package):
#   1. cmake --install into a scratch prefix: the tools, headers, static libraries, CMake package, Python package
#   2. examples/consumer configured and built against that prefix alone (find_package(hopwise)), run by mpirun
#   3. import hopwise.torch from the prefix's site-packages in a clean environment (env -i: PYTHONPATH to the prefix
#      alone), and a 2-rank torchrun job allreducing through the installed backend
#   4. cpack -G DEB: hopwise, libhopwise-dev; every dependency a Debian package this machine knows; dpkg --dry-run
#      -i accepts them; unpacked into a scratch root, the tool runs and the consumer builds
#      (hopwise.torch is a wheel, not a .deb: tests/wheel_check.sh)
# usage: install_check.sh SOURCE_DIR BUILD_DIR [PYTHON]   (PYTHON: the torch environment's, where the build has
#        the PyTorch backend)
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
work="$build/install-check"
rm -rf "$work"
mkdir -p "$work"
step() { echo "== $*"; }
fail() { echo "FAILED: $*" >&2; exit 1; }
python=${3:-}
clean_env=(env -i PATH=/usr/bin:/bin HOME="$work" LANG=C.UTF-8 OMP_NUM_THREADS=1)
has_torch=$([ -n "$python" ] && echo 1 || echo 0)

step "1. cmake --install $build --prefix $work/prefix"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
prefix="$work/prefix"
for f in bin/hopwise-topo bin/hopwise-bench bin/hopwise-tune lib/libhopwise_comm.a include/hopwise/comm/communicator.h \
         lib/libhopwise_training.a include/hopwise/training/reducer.h \
         lib/cmake/hopwise/hopwiseConfig.cmake lib/cmake/hopwise/hopwiseTargets.cmake; do
  [ -e "$prefix/$f" ] || fail "cmake --install left out $f"
done
"$prefix/bin/hopwise-topo" --help | grep -q "hopwise-topo" || fail "the installed hopwise-topo does not run"
echo "installed: $(find "$prefix" -type f | wc -l) files"

step "2. examples/consumer against $prefix, setting no C++ standard of its own"
# As a consumer that never set CMAKE_CXX_STANDARD: the C++20 the headers need must come from hopwise's targets
# (cxx_std_20), not from the compiler's default (GCC 12's is gnu++17, where std::span does not exist).
if grep -v '^[[:space:]]*#' "$src/examples/consumer/CMakeLists.txt" | grep -q "CMAKE_CXX_STANDARD\|cxx_std_"; then
  fail "examples/consumer/CMakeLists.txt sets the C++ standard: it would hide a package that does not carry it"
fi
cmake -S "$src/examples/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" >"$work/consumer.log"
grep -q "$prefix/lib/cmake/hopwise" "$work/consumer/CMakeCache.txt" || fail "find_package(hopwise) did not find $prefix"
cmake --build "$work/consumer" >>"$work/consumer.log" || fail "examples/consumer did not build: $(tail -20 "$work/consumer.log")"
grep -rqE -- "-std=(c|gnu)\+\+(20|2a|23|2b)" "$work/consumer/CMakeFiles/consumer.dir/flags.make" ||
  fail "the consumer was not compiled as C++20: $(grep CXX_FLAGS "$work/consumer/CMakeFiles/consumer.dir/flags.make")"
mpirun --allow-run-as-root --oversubscribe -np 2 "$work/consumer/consumer"

# A 2-rank torchrun job through the installed backend: both ranks' sum, checked on each.
cat >"$work/smoke.py" <<'PY'
import os, sys
import torch, torch.distributed as dist
import hopwise.torch
dist.init_process_group("hopwise")
r, n = dist.get_rank(), dist.get_world_size()
t = torch.arange(1000, dtype=torch.float32) + r
dist.all_reduce(t)
want = torch.arange(1000, dtype=torch.float32) * n + n * (n - 1) / 2
assert torch.equal(t, want), f"rank {r}: wrong sum"
if r == 0:
    print(f"hopwise.torch from {os.path.dirname(hopwise.torch.__file__)}: allreduce over {n} ranks ok")
dist.destroy_process_group()
PY
torch_job() {  # torch_job SITE_DIR: import and allreduce from SITE_DIR, nothing else on the path
  local site=$1
  (cd "$work" && "${clean_env[@]}" PYTHONPATH="$site" $python -c \
    "import hopwise.torch, sys; f = hopwise.torch.__file__; sys.exit(0 if f.startswith('$site/') else f'imported {f}')")
  (cd "$work" && "${clean_env[@]}" PYTHONPATH="$site" $python -m torch.distributed.run --standalone --nproc_per_node 2 --redirects 1 \
     --tee 1 "$work/smoke.py" 2>&1 | tee "$work/torchrun.log" | grep "allreduce over 2 ranks ok") \
    || fail "the torchrun job with hopwise.torch from $site failed: $(tail -30 "$work/torchrun.log")"
}
if [ "$has_torch" = 1 ]; then
  step "3. import hopwise.torch from the prefix, clean environment"
  pyver=$($python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  torch_job "$prefix/lib/python$pyver/site-packages"
else
  step "3. skipped: this build has no PyTorch backend"
fi

step "4. cpack -G DEB"
(cd "$build" && cpack -G DEB -B "$work/debs" >"$work/cpack.log") || fail "cpack: $(tail -20 "$work/cpack.log")"
debs=("$work"/debs/*.deb)
wanted=(hopwise libhopwise-dev)
for name in "${wanted[@]}"; do
  ls "$work"/debs/"${name}"_*.deb >/dev/null 2>&1 || fail "cpack made no $name package: ${debs[*]}"
done
for deb in "${debs[@]}"; do
  pkg=$(dpkg-deb -f "$deb" Package)
  depends=$(dpkg-deb -f "$deb" Depends)
  echo "$pkg: Depends: $depends"
  [ -n "$depends" ] || fail "$pkg depends on nothing"
  # Each alternative's package must be one Debian knows here (installed by scripts/setup.sh or as a dependency).
  for dep in $(echo "$depends" | tr ',|' '\n\n' | sed 's/(.*)//; s/ //g' | sort -u); do
    dpkg-query -W -f='${Status}\n' "$dep" 2>/dev/null | grep -q "install ok installed" ||
      fail "$pkg depends on '$dep', which is not an installed Debian package"
  done
  if dpkg-deb -c "$deb" | grep -q "/usr/local/cuda"; then fail "$pkg carries CUDA files"; fi
done
dpkg --dry-run -i "${debs[@]}" >"$work/dpkg.log" 2>&1 || fail "dpkg --dry-run -i: $(cat "$work/dpkg.log")"
root="$work/root"
for deb in "${debs[@]}"; do dpkg-deb -x "$deb" "$root"; done
"$root/usr/bin/hopwise-topo" --help | grep -q "hopwise-topo" || fail "hopwise-topo from the .deb does not run"
cmake -S "$src/examples/consumer" -B "$work/consumer-deb" -DCMAKE_PREFIX_PATH="$root/usr" >"$work/consumer-deb.log"
cmake --build "$work/consumer-deb" >>"$work/consumer-deb.log" || fail "the consumer did not build against the .deb's files"
mpirun --allow-run-as-root --oversubscribe -np 2 "$work/consumer-deb/consumer"
echo "install and packages ok: $(printf '%s ' "${debs[@]##*/}")"
