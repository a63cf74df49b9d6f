"""A torchrun job on the emulated cluster (scripts/local-cluster.sh torchrun) that writes a JSON summary: the
benchmark scripts' shared way to run one. torchrun agents of a gloo job sometimes linger at exit, so a
run is over once its JSON is written (then the agents get 20 s, and are killed)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_torchrun(hosts, per_host, program_args, out, env=None, limit_s=3600, python=None):
    """Runs `python PROGRAM_ARGS...` (by default this interpreter: the torch environment's) on `hosts` x `per_host`
    ranks; returns the JSON it wrote to `out`."""
    cmd = [str(ROOT / "scripts" / "local-cluster.sh"), "torchrun", "--nnodes", str(hosts), "--nproc_per_node",
           str(per_host), python or sys.executable, *program_args]
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    p = subprocess.Popen(cmd, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + limit_s
    while p.poll() is None and time.time() < deadline:
        if os.path.exists(out) and os.path.getsize(out) > 0:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            break
        time.sleep(1)
    if p.poll() is None:
        subprocess.run(["pkill", "-f", "torchrun --nnodes"], check=False)
        os.killpg(p.pid, 9)
    if not os.path.exists(out):
        sys.exit(f"cluster_torchrun: the run wrote no {out} (exit status {p.returncode}); run it by hand to see "
                 f"why: {' '.join(cmd)}")
    with open(out) as f:
        return json.load(f)
