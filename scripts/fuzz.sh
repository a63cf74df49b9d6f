#!/usr/bin/env bash
# Fuzzes every reader of untrusted text with libFuzzer under AddressSanitizer + UndefinedBehaviorSanitizer:
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 300 s each, all twelve targets: about an hour)
# Builds build-fuzz/ with clang, seeds each corpus from ../shared/topologies (the matching format; JSON seeds are
# those files converted by hopwise-topo) a few codec and averaging spec strings and checkpoint headers, then runs the targets one after another.
# Corpora and crash artifacts stay under build-fuzz/. Exits non-zero when any target crashed, leaked, hung, ran out
# of memory or hit undefined behaviour; the artifact named in its log replays it: build-fuzz/bin/<target> <artifact>.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
secs=${1:-300}
shift || true
all_targets=(fuzz_hwloc_xml fuzz_nccl_xml fuzz_nvidia_smi fuzz_json fuzz_topology fuzz_codec_spec fuzz_tuning_file
             fuzz_averaging_spec fuzz_monitor_spec fuzz_store_server fuzz_checkpoint_header fuzz_elastic_values
             fuzz_outer_state)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
shared=${HOPWISE_SHARED_TOPOLOGIES:-$repo/../shared/topologies}
out=$repo/build-fuzz
jobs=$(nproc)

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 2; }
# -O1 keeps the fuzzer fast while the stack traces stay readable; UB aborts instead of printing and going on.
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B "$out" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -g" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" \
  -DHOPWISE_FUZZ=ON -DHOPWISE_BUILD_TESTS=OFF -DHOPWISE_WITH_CUDA=OFF -DHOPWISE_TORCH=OFF >/dev/null
cmake --build "$out" -j"$jobs" --target hopwise_fuzzers hopwise-topo

# ---- seeds: the shared files are read where they lie; JSON seeds are them converted by hopwise-topo ----
seeds=$out/seeds
rm -rf "$seeds"
mkdir -p "$seeds"/{json,codec,tuning,averaging,monitor,store,checkpoint,elastic,outer,empty}
if [ -d "$shared" ]; then
  for f in "$shared"/*/*.xml "$shared"/*/*.txt; do
    [ -f "$f" ] || continue
    "$out/bin/hopwise-topo" convert "$f" --to json -o "$seeds/json/$(basename "$f").json" >/dev/null 2>&1 ||
      echo "fuzz.sh: no JSON seed from $f (hopwise-topo refused it)" >&2
  done
else
  echo "fuzz.sh: $shared not found; the topology targets start without seed files" >&2
fi
shared_dir() { if [ -d "$shared/$1" ]; then echo "$shared/$1"; else echo "$seeds/empty"; fi; }
i=0
for s in none fp16 bf16 int8:block=256,round=stochastic qsgd:levels=16 terngrad sign:ef=1 topk:ratio=0.01,ef=1 \
         randomk:ratio=0.01 powersgd:rank=4,warmup=100 " int8 : block = 256 "; do
  printf '%s' "$s" >"$seeds/codec/seed$((i++))"
done

i=0
for s in sync local:period=8,warmup=100 hier:period=4 gossip gossip:peers=2,codec=int8 async:period=8 \
         async:codec=int8,period=4,warmup=20 " local : period = 3 "; do
  printf '%s' "$s" >"$seeds/averaging/seed$((i++))"
done

i=0
for s in interval=10s interval=500ms,every=4,alert_after=2 interval=2m every=1 0.5 50% 1 on; do
  printf '%s' "$s" >"$seeds/monitor/seed$((i++))"
done

# train_mnist checkpoint headers as save_checkpoint writes them, the first one with some of the parameters after it,
# the second with every count at its bound.
printf '%b' 'hopwise-train_mnist-checkpoint 3\n20 2 128 13577422701659836820 1863690 30\n\x00\x00\x80\x3f' \
  >"$seeds/checkpoint/seed0"
printf '%b' 'hopwise-train_mnist-checkpoint 3\n1073741824 1048576 2147483647 0 68719476736 2199024304128\n' \
  >"$seeds/checkpoint/seed1"

# Elastic store values: a member list (first byte even) and ticket 1's admission (first byte odd).
printf '%b' '\x000,1,3,7' >"$seeds/elastic/seed0"
printf '%b' '\x012 4 1 5' >"$seeds/elastic/seed1"

# The outer path's saved state (training/src/averaging/outer_state.h): settings, a choice text, a synced model of 2,
# no momentum, one codec part and a fragment in flight.
printf '%b' 'hopwise-outer 1\n8 0 0.7 0.9 1 2 1 0 int8 0\n\x02\x00\x00\x00\x00\x00\x00\x00hi\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00' >"$seeds/outer/seed0"

# Store server scripts (tests/fuzz/fuzz_store_server.cpp): a byte of flags, then steps of [client | step << 2][length]
# [bytes]: a client that introduces itself, sets, gets, adds and reads; a stranger's 1 GiB length; an HTTP probe.
printf '%b' '\x00\x00\x00\x08\x00\x08\x06\x00\x01k1v1\x08\x04\x01\x00kk\x08\x04\x03\x7fkk\x0c\x00' >"$seeds/store/seed0"
printf '%b' '\x01\x01\x00\x05\x04\xff\xff\xff\x3f\x0d\x00\x1a\x07' >"$seeds/store/seed1"
printf '%b' '\x00\x02\x00\x06\x12GET / HTTP/1.0\r\n\r\n\x0e\x00' >"$seeds/store/seed2"

# A tuning file as hopwise-tune writes it, and one entry with every optional field.
cat >"$seeds/tuning/seed0" <<'JSON'
{
  "format": "hopwise-tuning/1",
  "version": "0.1.0", "machine": "seed", "created": "2026-12-01T00:00:00Z", "transport": "mpi",
  "job": {"ranks": 4, "hosts": 2, "ranks_per_host": 2},
  "entries": [
    {"collective":"allreduce","dtype":"float","max_bytes":4096,"algorithm":"one_shot","time_us":12.5,"measured_us":{"ring":20.1,"one_shot":12.5}},
    {"collective":"allreduce","dtype":"half","max_bytes":67108864,"algorithm":"ring","chunk_bytes":1048576,"channels":1,"time_us":5000},
    {"collective":"reduce_scatter","dtype":"int","max_bytes":1024,"algorithm":"native","time_us":3}
  ]
}
JSON

seed_dirs() {
  case $1 in
    fuzz_hwloc_xml) shared_dir hwloc ;;
    fuzz_nccl_xml) shared_dir nccl ;;
    fuzz_nvidia_smi) shared_dir nvidia-smi ;;
    fuzz_json) echo "$seeds/json" ;;
    fuzz_topology) echo "$(shared_dir hwloc) $(shared_dir nccl) $(shared_dir nvidia-smi) $seeds/json" ;;
    fuzz_codec_spec) echo "$seeds/codec" ;;
    fuzz_tuning_file) echo "$seeds/tuning" ;;
    fuzz_averaging_spec) echo "$seeds/averaging" ;;
    fuzz_monitor_spec) echo "$seeds/monitor" ;;
    fuzz_store_server) echo "$seeds/store" ;;
    fuzz_checkpoint_header) echo "$seeds/checkpoint" ;;
    fuzz_elastic_values) echo "$seeds/elastic" ;;
    fuzz_outer_state) echo "$seeds/outer" ;;
    *) echo "fuzz.sh: unknown target '$1'; use one of: ${all_targets[*]}" >&2; exit 2 ;;
  esac
}

# ---- runs ----
# Leaks are checked at exit of every input (-detect_leaks=1); 2 GiB of RSS or 30 s on one input counts as a failure.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
summary=()
failed=0
for t in "${targets[@]}"; do
  dirs=$(seed_dirs "$t")
  corpus=$out/corpus/$t
  art=$out/artifacts/$t
  log=$out/logs/$t.log
  mkdir -p "$corpus" "$art" "$out/logs"
  dict=()
  [ "$t" = fuzz_codec_spec ] || [ "$t" = fuzz_tuning_file ] || [ "$t" = fuzz_averaging_spec ] || [ "$t" = fuzz_monitor_spec ] ||
    [ "$t" = fuzz_store_server ] || [ "$t" = fuzz_checkpoint_header ] || [ "$t" = fuzz_elastic_values ] ||
    [ "$t" = fuzz_outer_state ] ||
    dict=(-dict=tests/fuzz/topology.dict)
  echo "== $t: ${secs}s (log: $log)"
  start=$(date +%s)
  rc=0
  # shellcheck disable=SC2086  # $dirs is a list of directories
  "$out/bin/$t" "$corpus" $dirs "${dict[@]}" -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -timeout=30 -detect_leaks=1 -print_final_stats=1 -artifact_prefix="$art/" >"$log" 2>&1 || rc=$?
  took=$(($(date +%s) - start))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  result=ok
  if [ "$rc" -ne 0 ]; then
    failed=1
    if grep -q "ERROR: LeakSanitizer" "$log"; then result=LEAK
    elif grep -q "ERROR: libFuzzer: timeout" "$log"; then result=HANG
    elif grep -q "out-of-memory" "$log"; then result=OOM
    elif grep -q "runtime error:" "$log"; then result=UB
    else result="CRASH"; fi
    result="$result (rc $rc) $(grep -o "Test unit written to .*" "$log" | tail -1 | sed 's/Test unit written to //')"
  fi
  summary+=("$(printf '%-16s %12s %8s  %s' "$t" "${runs:-?}" "$took" "$result")")
done

echo
printf '%-16s %12s %8s  %s\n' target runs seconds result
printf '%s\n' "${summary[@]}"
exit "$failed"
