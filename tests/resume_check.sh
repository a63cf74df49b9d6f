#!/bin/bash
# train_mnist --checkpoint / --checkpoint-every / --resume under one averaging method (20 steps an epoch here):
#  - two epochs straight against one epoch, its checkpoint and a resumed second epoch: the same test accuracy;
#  - mid-epoch: checkpoints every 7 steps (7, 14, then the epoch's end, 20); with rank 1's step-20 file gone, as if
#    it was killed between the others' renames and its own, the ranks agree on step 14 and land where the straight
#    run with the same flags does;
#  - refused on every rank, naming what is wrong: another method's state, files of two runs mixed, a --resume PATH
#    with no files; --resume auto with no files starts afresh.
#  - every=N instead (N < 20 and not a multiple of the method's period): mid-period. Checkpoints every N steps; the
#    first epoch's run loses its step-20 files (both ranks, as if killed before the epoch's end), so the resumed run
#    starts from step N, in the middle of a period (diloco: a fragment's all-reduce in flight there, the outer
#    momentum and the codec's residuals in the averaging state). It must end bit-identical to the run that went
#    straight through with the same checkpoints: the same test accuracy, and the step-40 files' parameters, momentum
#    and averaging state byte for byte. Then the refusal of another method's state.
#   resume_check.sh MPIEXEC TRAIN_MNIST WORKDIR AVERAGING [mid|every=N]   (mid: the mid-epoch part and the refusals)
set -euo pipefail
mpiexec=$1 train=$2 dir=$3 averaging=$4 mid=${5:-}
rm -rf "$dir"
mkdir -p "$dir"
run() { "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$train" --limit 2560 --algo ring --averaging "$averaging" "$@"; }
accuracy() { /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['test_accuracy'])" "$1"; }
expect_refused() {  # LOG PATTERN: the run failed and both ranks said PATTERN
  [ "$(grep -c -- "$2" "$1")" -ge 2 ] || { cat "$1"; echo "not every rank said: $2"; exit 1; }
}
same_data() {  # A B: two checkpoint files hold the same step, counts and data (their runs' ids differ)
  /usr/bin/python3 - "$1" "$2" << 'PY'
import sys
a, b = (open(p, "rb").read().split(b"\n", 2) for p in sys.argv[1:])
counts = lambda h: h[1].split(b" ")
if a[0] != b[0] or counts(a)[:3] + counts(a)[4:] != counts(b)[:3] + counts(b)[4:]:
    sys.exit(f"{sys.argv[1]} and {sys.argv[2]}: headers differ: {a[:2]} {b[:2]}")
if a[2] != b[2]:
    at = next(i for i, (x, y) in enumerate(zip(a[2], b[2])) if x != y) if len(a[2]) == len(b[2]) else -1
    sys.exit(f"{sys.argv[1]} and {sys.argv[2]}: the data differ (first at byte {at} after the header)")
PY
}

if [[ $mid == every=* ]]; then
  n=${mid#every=}
  run --epochs 2 --checkpoint "$dir/straight" --checkpoint-every "$n" --json "$dir/straight.json" > "$dir/straight.log"
  run --epochs 1 --checkpoint "$dir/ckpt" --checkpoint-every "$n" > "$dir/first.log"
  rm "$dir/ckpt.step20.rank0" "$dir/ckpt.step20.rank1"
  run --epochs 2 --checkpoint "$dir/ckpt" --checkpoint-every "$n" --resume auto --json "$dir/resumed.json" \
    > "$dir/resumed.log"
  grep -q "resumed at step $n (epoch 1, step $n of it)" "$dir/resumed.log" ||
    { cat "$dir/resumed.log"; echo "not resumed at step $n"; exit 1; }
  a=$(accuracy "$dir/straight.json") b=$(accuracy "$dir/resumed.json")
  echo "every $n steps straight: test accuracy $a after 2 epochs; resumed at step $n: $b ($averaging)"
  [ "$a" = "$b" ] || { echo "the run resumed mid-period ended elsewhere"; exit 1; }
  for r in 0 1; do same_data "$dir/straight.step40.rank$r" "$dir/ckpt.step40.rank$r"; done
  echo "step 40: parameters, momentum and averaging state bit-identical on both ranks"
  if run --epochs 2 --resume "$dir/ckpt" --averaging hier:period=5 > "$dir/wrong.log" 2>&1; then
    echo "resuming under another method was accepted"; exit 1
  fi
  grep -q "the state was saved by '${averaging%%:*}:" "$dir/wrong.log" || { cat "$dir/wrong.log"; exit 1; }
  ls "$dir"/*.tmp 2> /dev/null && { echo "a save left its temporary file"; exit 1; }
  echo "resume matches"
  exit 0
fi

run --epochs 2 --checkpoint "$dir/two" --json "$dir/straight.json" > "$dir/straight.log"
run --epochs 1 --checkpoint "$dir/ckpt" > "$dir/first.log"
ls "$dir"/ckpt.step20.rank0 "$dir"/ckpt.step20.rank1 > /dev/null
run --epochs 2 --resume "$dir/ckpt" --json "$dir/resumed.json" > "$dir/resumed.log"
grep -q "resumed at step 20 (epoch 2, step 0 of it)" "$dir/resumed.log" || { cat "$dir/resumed.log"; echo "the resumed run did not say it resumed"; exit 1; }
a=$(accuracy "$dir/straight.json") b=$(accuracy "$dir/resumed.json")
echo "straight: test accuracy $a after 2 epochs; resumed after 1: $b ($averaging)"
[ "$a" = "$b" ] || { echo "the resumed run ended elsewhere"; exit 1; }

# Mid-epoch, and the newest step every rank holds.
if [ "$mid" = mid ]; then
  run --epochs 2 --checkpoint "$dir/every" --checkpoint-every 7 --json "$dir/every.json" > "$dir/every.log"
  run --epochs 1 --checkpoint "$dir/mid" --checkpoint-every 7 > "$dir/mid1.log"
  [ "$(cd "$dir" && ls mid.step*.rank0 | sort | tr '\n' ' ')" = "mid.step14.rank0 mid.step20.rank0 " ] ||
    { ls "$dir"; echo "each rank keeps its two newest steps"; exit 1; }
  rm "$dir/mid.step20.rank1"
  run --epochs 2 --checkpoint "$dir/mid" --checkpoint-every 7 --resume auto --json "$dir/mid.json" > "$dir/mid2.log"
  grep -q "resumed at step 14 (epoch 1, step 14 of it)" "$dir/mid2.log" || { cat "$dir/mid2.log"; echo "not resumed at step 14"; exit 1; }
  a=$(accuracy "$dir/every.json") b=$(accuracy "$dir/mid.json")
  echo "every 7 steps straight: $a; resumed at step 14: $b"
  [ "$a" = "$b" ] || { echo "the run resumed mid-epoch ended elsewhere"; exit 1; }
fi

# Refused: another method's state names both.
if run --epochs 2 --resume "$dir/ckpt" --averaging hier:period=5 > "$dir/wrong.log" 2>&1; then
  echo "resuming under another method was accepted"; exit 1
fi
grep -q "the state was saved by '${averaging%%,*}" "$dir/wrong.log" || { cat "$dir/wrong.log"; exit 1; }
# What no method changes, once: files of two runs mixed, no common step, no files.
if [ "$mid" = mid ]; then
  # Files of two runs mixed at one step.
  cp "$dir/two.step20.rank0" "$dir/mixed.step20.rank0"
  cp "$dir/ckpt.step20.rank1" "$dir/mixed.step20.rank1"
  if run --epochs 3 --resume "$dir/mixed" > "$dir/mixed.log" 2>&1; then
    echo "resuming from files of different runs was accepted"; exit 1
  fi
  expect_refused "$dir/mixed.log" "files of step 20 are of different runs (rank 0: [0-9a-f]*, rank 1: [0-9a-f]*); rank(s) 1 differ"
  # No step every rank holds.
  cp "$dir/two.step40.rank0" "$dir/apart.step40.rank0"
  cp "$dir/ckpt.step20.rank1" "$dir/apart.step20.rank1"
  if run --epochs 3 --checkpoint "$dir/apart" --resume auto > "$dir/apart.log" 2>&1; then
    echo "resuming with no step in common was accepted"; exit 1
  fi
  expect_refused "$dir/apart.log" "no step that every rank holds whole (rank 0: 40; rank 1: 20)"
  # --resume PATH without files fails; --resume auto without files starts afresh.
  if run --epochs 1 --resume "$dir/none" > "$dir/none.log" 2>&1; then echo "--resume of no files was accepted"; exit 1; fi
  grep -q -- "--resume $dir/none: no checkpoint files" "$dir/none.log" || { cat "$dir/none.log"; exit 1; }
  run --epochs 1 --checkpoint "$dir/fresh" --resume auto > "$dir/fresh.log"
  grep -q "resumed" "$dir/fresh.log" && { echo "a fresh run said it resumed"; exit 1; }
fi
ls "$dir"/*.tmp 2> /dev/null && { echo "a save left its temporary file"; exit 1; }
echo "resume matches"
