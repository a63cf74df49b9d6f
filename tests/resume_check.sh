#!/bin/bash
# train_mnist --checkpoint / --resume: two epochs straight against one epoch, a checkpoint, and a resumed second
# epoch, under the same averaging method; the resumed run must end with the same test accuracy (the same model).
# Files of different saves mixed (rank 0's after epoch 2, rank 1's after epoch 1) fail on both ranks, naming them.
#   resume_check.sh MPIEXEC TRAIN_MNIST WORKDIR AVERAGING
set -euo pipefail
mpiexec=$1 train=$2 dir=$3 averaging=$4
mkdir -p "$dir"
rm -f "$dir"/ckpt.rank* "$dir"/two.rank* "$dir"/mixed.rank* "$dir"/straight.json "$dir"/resumed.json
run() { "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$train" --limit 2560 --algo ring --averaging "$averaging" "$@"; }
run --epochs 2 --checkpoint "$dir/two" --json "$dir/straight.json" > "$dir/straight.log"
run --epochs 1 --checkpoint "$dir/ckpt" > "$dir/first.log"
ls "$dir"/ckpt.rank0 "$dir"/ckpt.rank1 > /dev/null
run --epochs 2 --resume "$dir/ckpt" --json "$dir/resumed.json" > "$dir/resumed.log"
grep -q "resumed after epoch 1" "$dir/resumed.log" || { echo "the resumed run did not say it resumed"; exit 1; }
a=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['test_accuracy'])" "$dir/straight.json")
b=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['test_accuracy'])" "$dir/resumed.json")
echo "straight: test accuracy $a after 2 epochs; resumed after 1: $b ($averaging)"
[ "$a" = "$b" ] || { echo "the resumed run ended elsewhere"; exit 1; }
# Another method's state is refused, naming both.
if run --epochs 2 --resume "$dir/ckpt" --averaging hier:period=5 > "$dir/wrong.log" 2>&1; then
  echo "resuming under another method was accepted"; exit 1
fi
grep -q "the state was saved by '${averaging%%,*}" "$dir/wrong.log" || { cat "$dir/wrong.log"; exit 1; }
cp "$dir/two.rank0" "$dir/mixed.rank0"
cp "$dir/ckpt.rank1" "$dir/mixed.rank1"
if run --epochs 3 --resume "$dir/mixed" > "$dir/mixed.log" 2>&1; then
  echo "resuming from files of different epochs was accepted"; exit 1
fi
[ "$(grep -c "different epochs (rank 0: 2, rank 1: 1); rank(s) 1 differ" "$dir/mixed.log")" -ge 2 ] ||
  { cat "$dir/mixed.log"; echo "not every rank named the mixed files"; exit 1; }
ls "$dir"/two.rank*.tmp 2> /dev/null && { echo "a save left its temporary file"; exit 1; }
echo "resume matches"
