#!/usr/bin/env python3
"""Goodput under failures: the language model (examples/torch_lm/train.py) on the emulated cluster, one replica per
host, each row run failure-free and then with a replica killed (SIGKILL) every --kill-every seconds and brought back
--back-after seconds later. A row's goodput is its failure-free run's time to the target (DDP's failure-free final
validation loss + 1%) over its faulty run's time to it; times are wall clock from the launch (start-up and
evaluations in both), read from the trace rank 0 appends at every evaluation (train.py --trace-file). A faulty run
gets 2 x its failure-free run's time; one that does not reach the target in it is "not reached".

    scripts/local-cluster.sh up 3 --slots 1 && scripts/local-cluster.sh shape 100mbit
    scripts/bench-goodput.py [--rows ddp diloco:SPEC ...] [--steps N] [--json FILE] [-- TRAIN_FLAGS]

Rows:
  ddp          DDP on gloo under torchrun --max-restarts, checkpointing every --checkpoint-every steps (in both runs:
               the cost of its fault tolerance): a kill ends every rank's attempt, torchrun starts them again at
               once and they resume from the newest checkpoint all of them hold (torchrun brings the replica back
               itself: --back-after does not apply).
  diloco:SPEC  hopwise DiLoCo with train.py --elastic over a file store: the survivors go on from the outer state;
               the killed replica is started again --back-after s later as a newcomer (HOPWISE_ELASTIC_JOIN=1) and
               joins at a boundary with the synced model, outer momentum and step.
Kills go round the hosts (1, 2, ..., 0, 1, ...): the replica on that host, whichever rank it holds. Also a
straggler row per method (--straggler): one replica's compute slowed to half speed (train.py's own steps sleep as
long again: train.py --slowdown), each row's step time against its failure-free one."""
import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "examples" / "torch_lm" / "train.py")
CLUSTER = str(ROOT / "scripts" / "local-cluster.sh")
TOLERANCE = 0.01


def workers(marker):
    """The train.py processes of one run (its trace file is in their command line), by pid; torchrun's agents, whose
    command line holds the program's too, are left out (their argv[1] is torchrun)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1].decode(errors="replace") == TRAIN and marker.encode() in argv:
            found.append(int(pid))
    return sorted(found)


def host_of(pid):
    """The emulated host a process runs in: its network namespace's name (ip netns identify)."""
    p = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True)
    return p.stdout.strip()


def in_host(i, argv, env, log):
    """argv run inside emulated host i (its network namespace and host name), in the background."""
    script = f'. "{ROOT}/scripts/cluster-env.sh"; in_host {i} "$@"'
    return subprocess.Popen(["bash", "-c", script, "in_host", *argv], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def read_trace(path, t0):
    """[(seconds since t0, step, bpb)] from the trace file."""
    out = []
    if os.path.exists(path):
        for line in open(path):
            wall, step, bpb = line.split()
            out.append((float(wall) - t0, int(step), float(bpb)))
    return out


class Killer(threading.Thread):
    """Every `every` s kills the replica on the next host (SIGKILL); `back(i)` starts one there again `after` s later
    (None: the launcher does). Records (seconds, what) events."""

    def __init__(self, marker, hosts, every, after, back, t0):
        super().__init__(daemon=True)
        self.marker, self.hosts, self.every, self.after, self.back, self.t0 = marker, hosts, every, after, back, t0
        self.events, self.stop = [], threading.Event()

    def run(self):
        k = 0
        while not self.stop.wait(self.t0 + self.every * (k + 1) - time.time()):
            target = (k + 1) % self.hosts
            victims = [p for p in workers(self.marker) if host_of(p) == f"h{target}"]
            for p in victims:
                os.kill(p, signal.SIGKILL)
            self.events.append((time.time() - self.t0, f"killed the replica on h{target} ({len(victims)} process)"))
            if self.back and not self.stop.wait(self.after):
                self.back(target)
                self.events.append((time.time() - self.t0, f"started a replica on h{target} again"))
            k += 1


def run_ddp(args, work, faulty, limit_s, straggler=False):
    trace, out = str(work / "trace"), str(work / "out.json")
    cmd = [CLUSTER, "torchrun", "--nnodes", str(args.hosts), "--nproc_per_node", "1", "--max-restarts", "100",
           sys.executable, TRAIN, "--backend", "gloo", *common(args), "--trace-file", trace, "--json", out,
           "--checkpoint", str(work / "ckpt"), "--checkpoint-every", str(args.checkpoint_every), "--resume", "auto",
           *(["--slowdown", f"{args.hosts - 1}:2"] if straggler else [])]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "build" / "python"))
    t0 = time.time()
    with open(work / "log", "w") as log:
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        killer = Killer(trace, args.hosts, args.kill_every, 0, None, t0) if faulty else None
        if killer:
            killer.start()
        finished = wait_for(out, p, t0 + limit_s)
        if killer:
            killer.stop.set()
        end(p)
    return figures(trace, out, t0, finished, killer)


def run_diloco(spec, args, work, faulty, limit_s, straggler=False):
    trace, out, store = str(work / "trace"), str(work / "out.json"), str(work / "store")
    base = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "build" / "python"),
                HOPWISE_ELASTIC="shrink,grow", HOPWISE_TIMEOUT_S=str(args.timeout_s))
    argv = [sys.executable, TRAIN, "--backend", "hopwise", "--diloco", spec, *common(args), "--trace-file", trace,
            "--json", out, "--elastic", store]
    logs, procs = [], []

    def start(i, join=False):
        env = dict(base, RANK=str(i), WORLD_SIZE=str(args.hosts), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        if join:
            env["HOPWISE_ELASTIC_JOIN"] = "1"
        slow = ["--slowdown", f"{args.hosts - 1}:2"] if straggler else []
        logs.append(open(work / f"log.h{i}.{len(logs)}", "w"))
        procs.append(in_host(i, argv + slow, env, logs[-1]))

    t0 = time.time()
    for i in range(args.hosts):
        start(i)
    killer = Killer(trace, args.hosts, args.kill_every, args.back_after, lambda i: start(i, True), t0) \
        if faulty else None
    if killer:
        killer.start()
    finished = wait_for(out, procs[0], t0 + limit_s, any_of=procs)
    if killer:
        killer.stop.set()
    for p in procs:
        end(p)
    return figures(trace, out, t0, finished, killer)


def scratch(keep):
    """A run's working directory: kept under `keep` where given, else removed after the run."""
    return contextlib.nullcontext(tempfile.mkdtemp(dir=keep)) if keep else tempfile.TemporaryDirectory()


def common(args):
    return ["--steps", str(args.steps), "--eval-every", str(args.eval_every), "--sample", "0", *args.flags]


def wait_for(out, proc, deadline, any_of=()):
    """Until the run's JSON is written (the run ended) or the deadline; True where it ended."""
    while time.time() < deadline:
        if os.path.exists(out) and os.path.getsize(out) > 0:
            return True
        if any_of and all(p.poll() is not None for p in any_of) or not any_of and proc.poll() is not None:
            time.sleep(1)
            return os.path.exists(out) and os.path.getsize(out) > 0
        time.sleep(0.5)
    return False


def end(p):
    try:
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def figures(trace, out, t0, finished, killer):
    d = json.load(open(out)) if finished else {}
    return {"trace": read_trace(trace, t0), "finished": finished, "wall_s": time.time() - t0,
            "step_ms": d.get("step_ms"), "val_bpb": d.get("val_bpb"), "bytes_per_step": d.get("bytes_per_step"),
            "events": killer.events if killer else []}


def seconds_to(run, target):
    return next((s for s, _, bpb in run["trace"] if bpb <= target), None)


def main():
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--rows", nargs="+", default=["ddp", "diloco:diloco:period=16,fragments=4,delay=1,codec=int8"])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--kill-every", type=float, default=60)
    ap.add_argument("--back-after", type=float, default=20)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--timeout-s", type=float, default=10, help="HOPWISE_TIMEOUT_S of the hopwise rows")
    ap.add_argument("--straggler", action="store_true", help="also each hopwise row with one replica at half speed")
    ap.add_argument("--target", type=float, default=0, help="the target loss (bits per byte), where no ddp row runs: "
                                                               "an earlier DDP run's final + 1%")
    ap.add_argument("--keep", default="", help="DIR: each run's logs and trace kept there (else removed)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    args.flags = flags
    results = {}

    def save():
        if args.json:
            json.dump(results, open(args.json, "w"), indent=1)

    for row in args.rows:
        kind, _, spec = row.partition(":")
        for faulty in (False, True):
            limit = 7200 if not faulty else 2 * results[row]["failure_free"]["wall_s"] + 60
            with scratch(args.keep) as tmp:
                work = Path(tmp)
                r = run_ddp(args, work, faulty, limit) if kind == "ddp" else run_diloco(spec, args, work, faulty, limit)
                r["work"] = str(work) if args.keep else None
            results.setdefault(row, {})["faulty" if faulty else "failure_free"] = r
            print(f"{row} {'faulty' if faulty else 'failure-free'}: {'ended' if r['finished'] else 'cut at the limit'}"
                  f" after {r['wall_s']:.0f} s, final {r['val_bpb']}, {len(r['events'])} event(s)", file=sys.stderr,
                  flush=True)
            save()
        if args.straggler:
            with scratch(args.keep) as tmp:
                work = Path(tmp)
                results[row]["straggler"] = run_ddp(args, work, False, 7200, straggler=True) if kind == "ddp" else \
                    run_diloco(spec, args, work, False, 7200, straggler=True)
            save()
    ddp = results.get("ddp", {}).get("failure_free")
    target = ddp["val_bpb"] * (1 + TOLERANCE) if ddp and ddp["val_bpb"] else args.target or None
    print(f"target: DDP's failure-free final loss + 1% = {target}")
    print("| row | failure-free to target (s) | faulty to target (s) | goodput | failure-free final | faulty final |")
    print("|---|---:|---:|---:|---:|---:|")
    for row, r in results.items():
        a, b = (seconds_to(r[k], target) if target else None for k in ("failure_free", "faulty"))
        good = f"{a / b:.2f}" if a and b else "not reached"
        print(f"| {row} | {a if a is None else f'{a:.0f}'} | {b if b is None else f'{b:.0f}'} | {good} | "
              f"{r['failure_free']['val_bpb']} | {r['faulty']['val_bpb']} |")
    results["target"] = target
    save()


if __name__ == "__main__":
    main()
