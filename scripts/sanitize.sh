#!/usr/bin/env bash
# Builds the whole project with AddressSanitizer + UndefinedBehaviorSanitizer (CMake preset asan-ubsan, into
# build-asan/) and runs every ctest test under it, the mpirun tests included. Extra arguments go to ctest
# (e.g. -R Topology, -L unit). Any out-of-bounds access, use-after-free, leak or undefined behaviour fails the test
# it happens in; tests/sanitizers/lsan.supp lists the leaks that are not hopwise's (Open MPI's) or are deliberate.
# Not part of CI: on 2 cores it takes well over the CI budget (see the README).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. scripts/mpi-env.sh
# Also for the test listing that gtest_discover_tests runs at build time.
export ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_init_order=1:verify_asan_link_order=0
export LSAN_OPTIONS=suppressions=$(pwd)/tests/sanitizers/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
start=$(date +%s)
cmake --preset asan-ubsan >/dev/null
cmake --build --preset asan-ubsan -j"$(nproc)"
# Keeps Open MPI's components and hwloc's plugins loaded until exit, so that LSan can see and name what they hold
# (see the file). Built without sanitizers: it is preloaded into mpirun and cmake too.
cc -O2 -shared -fPIC -o build-asan/keep_loaded.so tests/sanitizers/keep_loaded.c
built=$(date +%s)
rc=0
LD_PRELOAD=$(pwd)/build-asan/keep_loaded.so ctest --preset asan-ubsan "$@" || rc=$?
echo "sanitize.sh: build $((built - start)) s, tests $(($(date +%s) - built)) s"
exit "$rc"
