#!/usr/bin/env bash
# PyTorch's own distributed tests (torch/testing/_internal/distributed/distributed_test.py, the selection torch runs
# for gloo) on gloo and on hopwise, with gloo's expectations, at 2 and 3 ranks; then a table of passed, failed and
# skipped per backend and world size, and the tests that pass on gloo but fail on hopwise. A benchmark-style check,
# not CI: the whole selection takes 30+ minutes per configuration on a small machine.
#
#   scripts/torch-suite.sh                                  # everything: gloo and hopwise at 2 and 3 ranks
#   scripts/torch-suite.sh -k "barrier or all_gather_coalesced or monitored"    # a subset (pytest -k)
#   TORCH_SUITE_SIZES=2 TORCH_SUITE_BACKENDS=hopwise scripts/torch-suite.sh -x  # other pytest arguments pass on
#   (the table compares with the other backend's files from an earlier run in the same folder)
#
# How: torch's test/distributed/test_distributed_spawn.py is not in the wheel, so a driver written here does what it
# does (TestDistBackend with DistributedTest._DistTestBase, spawned ranks, file:// rendezvous) under pytest, with
# BACKEND=gloo so that every test keeps gloo's expectations and skips; for hopwise the driver imports hopwise.torch
# and hands init_process_group and new_group "hopwise" wherever the tests ask for "gloo". Results (junit XML, logs)
# go to $TORCH_SUITE_OUT (default build/torch-suite). The PYTHONPATH of this tree's build (build/python) is used.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${HOPWISE_BUILD_DIR:-$root/build}
python=${HOPWISE_PYTHON:-$("$root/scripts/venv.sh" --path)/bin/python}
out=${TORCH_SUITE_OUT:-$build/torch-suite}
sizes=${TORCH_SUITE_SIZES:-2 3}
backends=${TORCH_SUITE_BACKENDS:-gloo hopwise}
mkdir -p "$out"

if [[ ! -e $build/python/hopwise/torch/__init__.py ]]; then
  echo "torch-suite: no hopwise.torch in $build/python; build it first (cmake --build build --target hopwise_torch_c)" >&2
  exit 1
fi

# torch's test helpers import expecttest, which torch's wheel does not bring: the environment has it
# (frontends/torch/requirements.txt, scripts/setup.sh).
"$python" -c "import expecttest" 2>/dev/null || { echo "torch-suite: expecttest is missing: run scripts/setup.sh"; exit 2; }

cat >"$out/test_torch_suite.py" <<'EOF'
"""torch's distributed_test.py for gloo's selection, on TORCH_SUITE_BACKEND (gloo or hopwise; written by
scripts/torch-suite.sh, as torch's test/distributed/test_distributed_spawn.py drives it)."""
import os

os.environ["BACKEND"] = "gloo"  # gloo's expectations and skips, whichever backend runs
HOPWISE = os.environ.get("TORCH_SUITE_BACKEND", "gloo") == "hopwise"

import torch.distributed as dist  # noqa: E402

if HOPWISE:
    import hopwise.torch  # noqa: F401  (registers "hopwise")

    def _hopwise(backend):
        return "hopwise" if backend is not None and str(backend).lower() == "gloo" else backend

    _init_process_group, _new_group = dist.init_process_group, dist.new_group

    def init_process_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _hopwise(kwargs["backend"])
        elif args:
            args = (_hopwise(args[0]),) + tuple(args[1:])
        else:
            kwargs["backend"] = "hopwise"
        return _init_process_group(*args, **kwargs)

    def new_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _hopwise(kwargs["backend"])
        elif len(args) > 2:
            args = tuple(args[:2]) + (_hopwise(args[2]),) + tuple(args[3:])
        return _new_group(*args, **kwargs)

    dist.init_process_group, dist.new_group = init_process_group, new_group

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    if HOPWISE:

        def test_get_backend(self):
            # torch's own test, expecting the backend's own name: it compares get_backend() with BACKEND, which stays
            # "gloo" here for gloo's expectations everywhere else.
            import torch.testing._internal.distributed.distributed_test as torch_test

            saved, torch_test.BACKEND = torch_test.BACKEND, "hopwise"
            try:
                DistributedTest._DistTestBase.test_get_backend(self)
            finally:
                torch_test.BACKEND = saved
EOF

# The table: counts per configuration from the junit files, and what gloo passes and hopwise fails.
summarize() {
  # Both backends' files, whichever this run made: the table compares them (a run may redo one backend).
  "$python" - "$out" "$sizes" "gloo hopwise" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

out, sizes, backends = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split()
results = {}
for b in backends:
    for n in sizes:
        f = out / f"{b}-{n}.xml"
        if not f.exists():
            continue
        r = {}
        for case in ET.parse(f).iter("testcase"):
            kinds = {c.tag for c in case}
            r[case.get("name")] = ("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds
                                   else "passed")
        results[(b, n)] = r
print(f"\n{'backend':<10}{'ranks':>6}{'passed':>8}{'failed':>8}{'skipped':>9}")
for (b, n), r in results.items():
    v = list(r.values())
    print(f"{b:<10}{n:>6}{v.count('passed'):>8}{v.count('failed'):>8}{v.count('skipped'):>9}")
for n in sizes:
    g, h = results.get(("gloo", n)), results.get(("hopwise", n))
    if g is None or h is None:
        continue
    worse = sorted(t for t, s in g.items() if s == "passed" and h.get(t) == "failed")
    print(f"\n{n} ranks: {len(worse)} test(s) pass on gloo and fail on hopwise" + (":" if worse else ""))
    for t in worse:
        print(f"  {t}")
EOF
}

for n in $sizes; do
  for b in $backends; do
    echo "torch-suite: $b at $n ranks (log $out/$b-$n.log)"
    rm -f "$out/$b-$n.xml"  # an earlier run's must not stand in for this one's
    # WORLD_SIZE for torch's tests; no RANK and no MASTER_PORT (each test spawns its ranks and picks a port).
    (cd "$out" && env -u RANK -u LOCAL_RANK -u MASTER_PORT BACKEND=gloo TORCH_SUITE_BACKEND="$b" WORLD_SIZE="$n" \
      PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 \
      "$python" -m pytest -q -p no:cacheprovider --junitxml="$out/$b-$n.xml" "$out/test_torch_suite.py" "$@" \
      >"$out/$b-$n.log" 2>&1) || true
    tail -n 1 "$out/$b-$n.log"
  done
done
summarize
