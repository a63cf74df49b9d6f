#!/bin/bash
# train_mnist's checkpoints never trust a planted file nor lose a valid save (2 ranks, 20 steps an epoch). Next to a
# valid step-20 save, each of these is skipped with a warning naming it, and the run resumes at step 20:
#  - headers whose step count is out of range (50*(2^32-3), 50*2^31, 9.2e18: once 0 steps trained, or a hang);
#  - a FIFO named like a checkpoint (once: rank 0 blocked in open() forever);
#  - a symlink to /dev/zero (once: a header read that grew to gigabytes).
# And retention: two cut-short files at higher steps (1000, 1010) no longer push out every new save.
#   checkpoint_check.sh MPIEXEC TRAIN_MNIST WORKDIR [PART...]   (parts: range keep fifo link; default all)
set -euo pipefail
mpiexec=$1 train=$2 dir=$3
shift 3
parts=" ${*:-range keep fifo link} "
part() { [[ $parts == *" $1 "* ]]; }
rm -rf "$dir"
mkdir -p "$dir"
# A bound only for what used to hang (a FIFO, /dev/zero): a run here takes seconds, even on a loaded machine.
run() {
  timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$train" --limit 2560 --hidden 64 --algo ring "$@"
}
fail() { [ -f "${2:-}" ] && cat "$2"; echo "FAILED: $1"; exit 1; }
resumed_at_20() {  # LOG: the run went on from the valid step-20 save
  grep -q "resumed at step 20 (epoch 2, step 0 of it)" "$1" || fail "not resumed at step 20 (the valid save)" "$1"
}
skipped() {  # LOG FILE WHY: a warning named FILE as not valid, saying WHY
  grep -q -- "checkpoint $2 is $3.*: skipped" "$1" || fail "no warning that $2 is $3" "$1"
}
valid_at_20() {  # NAME: NAME's step-20 files, copies of a valid save
  cp "$dir/base.step20.rank0" "$dir/$1.step20.rank0"
  cp "$dir/base.step20.rank1" "$dir/$1.step20.rank1"
}

run --epochs 1 --checkpoint "$dir/base" > "$dir/base.log" 2>&1 || fail "the first run failed" "$dir/base.log"

# 1. Out-of-range step counts: the header otherwise whole (its size fits its counts) and named for its step.
if part range; then
  for steps in 214748364650 107374182400 9200000000000000000; do
    name=range$steps
    valid_at_20 "$name"
    for r in 0 1; do
      /usr/bin/python3 - "$dir/base.step20.rank$r" "$dir/$name.step$steps.rank$r" "$steps" << 'PY'
import sys
data = open(sys.argv[1], "rb").read()
first, second, rest = data.split(b"\n", 2)
fields = second.split(b" ")
fields[0] = sys.argv[3].encode()
open(sys.argv[2], "wb").write(first + b"\n" + b" ".join(fields) + b"\n" + rest)
PY
    done
    run --epochs 2 --checkpoint "$dir/$name" --resume auto > "$dir/$name.log" 2>&1 ||
      fail "the run next to a header of $steps steps failed" "$dir/$name.log"
    resumed_at_20 "$dir/$name.log"
    skipped "$dir/$name.log" "$dir/$name.step$steps.rank0" "not a train_mnist checkpoint"
    skipped "$dir/$name.log" "$dir/$name.step$steps.rank1" "not a train_mnist checkpoint"
    echo "a header of $steps steps: skipped, resumed at step 20"
  done
fi

# 2. Retention: cut-short files at higher steps are neither counted as saves nor removed.
if part keep; then
  for r in 0 1; do
    head -c 1000 "$dir/base.step20.rank$r" > "$dir/keep.step1000.rank$r"
    head -c 100 /dev/urandom > "$dir/keep.step1010.rank$r"
  done
  run --epochs 1 --checkpoint "$dir/keep" --checkpoint-every 7 --resume auto > "$dir/keep.log" 2>&1 ||
    fail "the run next to cut-short files failed" "$dir/keep.log"
  for f in keep.step14.rank0 keep.step14.rank1 keep.step20.rank0 keep.step20.rank1 keep.step1000.rank0 \
    keep.step1010.rank1; do
    [ -f "$dir/$f" ] || { ls "$dir"; fail "$f is gone"; }
  done
  [ ! -e "$dir/keep.step7.rank0" ] || { ls "$dir"; fail "keep.step7.rank0 was kept: three saves"; }
  skipped "$dir/keep.log" "$dir/keep.step1000.rank0" "cut short"
  [ "$(grep -c "keep.step1000.rank0 is" "$dir/keep.log")" = 1 ] || fail "keep.step1000.rank0 named more than once" "$dir/keep.log"
  run --epochs 2 --checkpoint "$dir/keep" --resume auto > "$dir/keep2.log" 2>&1 || fail "the resume failed" "$dir/keep2.log"
  resumed_at_20 "$dir/keep2.log"
  echo "cut-short files at steps 1000 and 1010: the valid saves 14 and 20 kept, resumed at step 20"
fi

# 3. A FIFO named like a checkpoint: not opened for reading nor waited on.
if part fifo; then
  valid_at_20 fifo
  mkfifo "$dir/fifo.step30.rank0"
  run --epochs 2 --checkpoint "$dir/fifo" --resume auto > "$dir/fifo.log" 2>&1 ||
    fail "the run next to a FIFO failed or hung (120 s)" "$dir/fifo.log"
  resumed_at_20 "$dir/fifo.log"
  skipped "$dir/fifo.log" "$dir/fifo.step30.rank0" "a FIFO, not a regular file"
  [ -p "$dir/fifo.step30.rank0" ] || fail "the FIFO was removed"
  echo "a FIFO: skipped, resumed at step 20"
fi

# 4. A symlink to /dev/zero: not followed.
if part link; then
  valid_at_20 link
  ln -s /dev/zero "$dir/link.step30.rank1"
  run --epochs 2 --checkpoint "$dir/link" --resume auto > "$dir/link.log" 2>&1 ||
    fail "the run next to a symlink to /dev/zero failed or hung (120 s)" "$dir/link.log"
  resumed_at_20 "$dir/link.log"
  skipped "$dir/link.log" "$dir/link.step30.rank1" "a symbolic link, which is not followed"
  echo "a symlink to /dev/zero: skipped, resumed at step 20"
fi

ls "$dir"/*.tmp 2> /dev/null && fail "a save left its temporary file"
echo "checkpoint refusals ok"
