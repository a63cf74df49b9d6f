"""scripts/diloco_recipe.py, the plain-PyTorch DiLoCo that hopwise's diloco averaging is compared with: its outer
step (pseudo-gradient averaged over gloo, Nesterov SGD on the synced copy, exact and int8) against a hand computation
on 2 ranks under torchrun (the script's --check)."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def test_diloco_recipe_outer_step():
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node", "2", "--redirects", "1", "--tee", "1",
           str(ROOT / "scripts" / "diloco_recipe.py"), "--check"]
    p = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    ok = re.findall(r"rank (\d): diloco check ok, 2 ranks, 3 outer steps exact and int8", p.stdout)
    assert p.returncode == 0 and sorted(ok) == ["0", "1"], p.stdout[-4000:]
