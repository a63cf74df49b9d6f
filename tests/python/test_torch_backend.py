"""The PyTorch backend as users run it: real ranks under torchrun, mpirun and a bare spawner (tests/spawn_ranks.sh),
each running one of the worker scripts beside this file. ctest runs this file in parts (tests/python.cmake)."""
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = Path(os.environ.get("HOPWISE_BUILD_DIR", ROOT / "build"))
PYTHON = sys.executable  # the environment with torch (scripts/setup.sh's; ctest runs pytest from it)
TORCHRUN = str(Path(PYTHON).parent / "torchrun")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(how, np, script, *args, env=None, timeout=300, grace=5):
    """Runs `script` on `np` ranks; returns (exit status, output)."""
    e = dict(os.environ, PYTHONPATH=str(BUILD / "python"), OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
             OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    e.setdefault("HOPWISE_TIMEOUT_S", "60")
    e.update(env or {})
    path = str(HERE / script)
    if how == "torchrun":
        cmd = [TORCHRUN, "--standalone", "--nproc_per_node", str(np), "--redirects", "1", "--tee", "1", path, *args]
    elif how in ("mpirun", "mpirun-bare"):
        forwarded = ["PYTHONPATH", "OMP_NUM_THREADS", "HOPWISE_TIMEOUT_S", *(env or {})]
        if how == "mpirun":  # torch's env:// variables, as a user may export them
            e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            forwarded += ["MASTER_ADDR", "MASTER_PORT"]
        else:  # as users run it: nothing exported; hopwise.torch finds the ranks and the store itself
            for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                e.pop(name, None)
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np)]
        for name in forwarded:
            cmd += ["-x", name]
        cmd += [PYTHON, path, *args]
    else:
        cmd = [str(ROOT / "tests" / "spawn_ranks.sh"), str(np), "--grace", str(grace), PYTHON, path, *args]
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def lines(output, pattern):
    return re.findall(pattern, output, re.MULTILINE)


def test_import_registers_the_backend():
    code = "import torch.distributed as d, hopwise.torch; assert d.Backend('hopwise') == 'hopwise'; print('ok')"
    p = subprocess.run([PYTHON, "-c", code], env=dict(os.environ, PYTHONPATH=str(BUILD / "python")),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout


# One rank, an even and an odd number under the two launchers (MPI's rendezvous is mpirun's); under mpirun with
# torch's variables exported, and bare (`mpirun -np 2 python train.py`, nothing exported: RANK, WORLD_SIZE and the
# store's address come from mpirun and MPI).
# Each launcher once and the world sizes 1 to 4 among them (CI's time: every launch costs 10-20 s on two cores).
@pytest.mark.parametrize("how,np", [("torchrun", n) for n in (1, 2, 4)] + [("mpirun", 3), ("mpirun-bare", 2)])
def test_collectives(how, np):
    rc, out = launch(how, np, "collectives_worker.py")
    # mpirun may join two ranks' lines into one: match anywhere, count ranks
    ok = dict(lines(out, r"rank (\d+): \d+ checks ok over (mpi|ucx)"))
    assert rc == 0 and sorted(ok) == [str(r) for r in range(np)], out[-6000:]
    assert set(ok.values()) == {"mpi" if how.startswith("mpirun") else "ucx"}, ok


def test_collectives_explicit_rank_wins_over_environment():
    """init_process_group("hopwise", rank=r, world_size=n) with WORLD_SIZE exported and RANK not (as gloo does, the
    arguments win over the environment)."""
    e = dict(os.environ, PYTHONPATH=str(BUILD / "python"), OMP_NUM_THREADS="1", HOPWISE_TIMEOUT_S="60",
             WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for name in ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        e.pop(name, None)
    procs = [subprocess.Popen([PYTHON, str(HERE / "collectives_worker.py"), "explicit", str(r), "2"], env=e,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    out = "\n".join(outs)
    assert all(p.returncode == 0 for p in procs), out[-6000:]
    assert sorted(lines(out, r"rank (\d+): \d+ checks ok over ucx")) == ["0", "1"], out[-6000:]


@pytest.mark.parametrize("how,np", [("torchrun", 2), ("mpirun", 3)])
def test_ddp_parity_with_gloo(how, np):
    rc, out = launch(how, np, "ddp_worker.py", "parity")
    assert rc == 0 and len(lines(out, r"parity ok: 20 steps")) == np, out[-6000:]


def test_ddp_hooks():
    rc, out = launch("torchrun", 2, "ddp_worker.py", "hooks")
    hooks = lines(out, r"hook (.+?): ok, loss")
    assert rc == 0, out[-6000:]
    for name in ["none", "fp16", "bf16", "int8", "qsgd", "terngrad", "sign", "topk:ratio=0.3", "randomk:ratio=0.5",
                 "powersgd:rank=2", "network:int8", "network:powersgd:rank=2", "torch fp16_compress_hook",
                 "torch powerSGD_hook"]:
        assert name in hooks, f"hook {name} did not run: {out[-6000:]}"


def test_hook_state_checkpoint():
    rc, out = launch("torchrun", 2, "ddp_worker.py", "checkpoint")
    assert rc == 0 and len(lines(out, r"checkpoint .+: ok")) == 4, out[-6000:]


def test_bad_input_is_refused_by_name():
    rc, out = launch("torchrun", 2, "faults_worker.py", "bad")
    assert rc == 0 and len(lines(out, r"bad input refused, group still works")) == 2, out[-6000:]
    assert len(lines(out, r"ValueError: hopwise: allreduce: dtype UInt16 is not supported")) == 2, out[-6000:]


def test_mismatched_shapes_under_check():
    rc, out = launch("torchrun", 2, "faults_worker.py", "mismatch", env={"HOPWISE_DEBUG": "CHECK"})
    said = lines(out, r"rank (\d): FAILED after \d+\.\d s: .*?ranks disagree on the collective call.*?count: 10 on rank 0, 12 on rank 1")
    assert rc != 0 and sorted(said) == ["0", "1"], out[-6000:]


@pytest.mark.parametrize("how", ["torchrun", "mpirun"])
def test_mismatched_shapes_checked_by_default(how):
    """No option set: the default call check names the count each rank passed (before it, the ranks exchanged
    whatever bytes matched)."""
    rc, out = launch(how, 2, "faults_worker.py", "mismatch")
    said = lines(out, r"rank (\d): FAILED after \d+\.\d s: .*?checked by default.*?count: 10 on rank 0, 12 on rank 1")
    assert rc != 0 and said, out[-6000:]  # the launcher may end the other rank before it says so


def test_stopped_rank_is_named_within_the_timeout():
    rc, out = launch("spawn", 3, "faults_worker.py", "stopped", env={"HOPWISE_TIMEOUT_S": "5"}, timeout=120)
    # Not greedy: two ranks' lines can arrive run together (one rank's newline after the other's text).
    said = lines(out, r"rank (\d): FAILED after (\d+\.\d) s: .*?rank 1 did not answer")
    assert rc != 0 and sorted(r for r, _ in said) == ["0", "2"], out[-6000:]
    # After the timeout, and long before a hang: the listening for the others and a loaded machine's scheduling
    # add seconds (scripts/test-stress.sh), so the bound is the timeout's next 10 s, as in tests/faults.cmake.
    assert all(float(s) < 5 + 10 for _, s in said), said


def test_barrier_names_missing_ranks(tmp_path):
    """Ranks 2 and 3 of 4 stay away: each failure names them, in the words torch's own tests match (gloo's)."""
    rc, out = launch("spawn", 4, "faults_worker.py", "barrier", env={"BARRIER_DONE": str(tmp_path / "done")},
                     timeout=120)
    failed = {(r, what): (float(s), why) for r, what, s, why in
              lines(out, r"rank (\d): (\S+) FAILED after (\d+\.\d) s: (.*?)$")}
    assert rc == 0 and len(failed) == 7, out[-6000:]
    said = {
        # torch's _test_barrier_timeout matches " (Timed out|closed|timeout) "
        ("0", "barrier"): "Timed out after 2.0 s: rank(s) 2, 3 of 4 did not arrive",
        ("1", "barrier"): "Timed out after 2.0 s: rank(s) 2, 3 of 4 did not arrive",
        # test_monitored_barrier_gloo and _failure_order: rank 0 names the first rank, then the rest
        ("0", "monitored_barrier"): "Rank 2 failed to pass monitoredBarrier in 2000 ms; rank(s) 3 had not arrived",
        ("1", "monitored_barrier"): "Rank 1 successfully reached monitoredBarrier, but received errors while "
                                    "waiting for send/recv from rank 0: rank 0 says rank(s) 2, 3 of 4",
        # test_monitored_barrier_wait_all_ranks
        ("0", "monitored_barrier(wait_all_ranks)"): "Ranks 2, 3 failed to pass monitoredBarrier in 2000 ms",
        ("1", "monitored_barrier(wait_all_ranks)"): "Rank 1 successfully reached monitoredBarrier, but received "
                                                    "errors while waiting for send/recv from rank 0: rank 0 says "
                                                    "rank(s) 2, 3 of 4",
        # test_monitored_barrier_gloo_rank_0_timeout: timeout 0 is no time at all, not "the group's"
        ("0", "monitored_barrier(timeout=0)"): "Rank 0 timed out in monitoredBarrier after 0 ms",
    }
    assert set(failed) == set(said), sorted(failed)
    for key, words in said.items():
        s, why = failed[key]
        assert words in why, (key, why)
        if key[1] == "barrier":
            assert re.search(" (Timed out|closed|timeout) ", why), why
        if key[1].endswith("(timeout=0)"):
            assert s < 10, (key, s)  # at once, not after the group's 60 s
        else:
            assert 1.5 < s < 2 + 10, (key, s)  # the timeout, not the group's 60 s
    assert len(lines(out, r"rank [01]: destroyed the group in")) == 2, out[-6000:]


@pytest.mark.parametrize("how", ["torchrun", "mpirun"])
def test_plan_and_stats(how):
    rc, out = launch(how, 2, "faults_worker.py", "api")
    assert rc == 0 and len(lines(out, r"api ok: ring \[")) == 2, out[-6000:]


@pytest.mark.parametrize("how,np", [("torchrun", 3), ("mpirun", 2)])  # each launcher, an odd and an even world
def test_averaging(how, np):
    rc, out = launch(how, np, "averaging_worker.py")
    ok = lines(out, r"rank (\d+): 16 methods match the serial simulation")
    assert rc == 0 and len(set(ok)) == np, out[-3000:]


@pytest.mark.parametrize("how,np", [("torchrun", 2), ("mpirun", 3)])  # each launcher, an even and an odd world
def test_compressed_allreduce(how, np):
    """hopwise.torch.allreduce on plain tensors: every codec family on sizes 0 to 1000003 against the exact mean or
    the codec's bound, error feedback over 20 calls, the CodecState's checkpoint and refusals, bad arguments."""
    rc, out = launch(how, np, "compressed_worker.py")
    ok = lines(out, r"rank (\d+): compressed allreduce ok: \d+ checks")
    assert rc == 0 and sorted(set(ok)) == [str(r) for r in range(np)], out[-6000:]


@pytest.mark.parametrize("how,np", [("torchrun", 2), ("mpirun", 3)])  # each launcher, even and uneven shards
def test_fsdp_compress(how, np):
    """hopwise.torch.fsdp: FSDP2's reduce-scatter and all-gather through codecs (float32 and bfloat16, blocks of 1 to
    100003) within each codec's bound of torch's exact collectives, error feedback's identity and a restored state,
    FSDP2 training compressed against uncompressed (padded shards, bf16 mixed precision), refusals by name."""
    rc, out = launch(how, np, "fsdp_worker.py")
    ok = lines(out, r"rank (\d+): fsdp ok: \d+ checks")
    assert rc == 0 and sorted(set(ok)) == [str(r) for r in range(np)], out[-6000:]


@pytest.mark.parametrize("how", ["torchrun", "mpirun"])
def test_diloco(how):
    """hopwise.torch.DiLoCo without DDP on 2 ranks: the same parameters as local SGD at outer_lr 1 and no momentum,
    the outer Nesterov step against plain torch to 1e-6, a run resumed mid-period bit-identical to the straight one."""
    rc, out = launch(how, 2, "diloco_worker.py")
    ok = lines(out, r"rank (\d+): diloco ok: \d+ checks")
    assert rc == 0 and sorted(set(ok)) == ["0", "1"], out[-6000:]


@pytest.mark.parametrize("how,np", [("torchrun", 2), ("mpirun", 3)])
def test_placement(how, np):
    """The averagers on models that are not float32 CPU tensors (placement_worker.py): the host-staged path equals the
    direct one bit for bit for every periodic method and codec, resumes mid-period, bf16 and fp16 models track a
    float32 run, and the refusals name the class called."""
    # one algorithm for both paths: the tuner may time another for the second run, whose sums round otherwise
    rc, out = launch(how, np, "placement_worker.py", env={"HOPWISE_ALGO": "ring"})
    ok = lines(out, r"rank (\d+): placement ok: \d+ checks")
    assert rc == 0 and sorted(set(ok)) == [str(r) for r in range(np)], out[-6000:]


def test_diloco_documented_specs():
    """Each averaging spec the docs, docstrings and examples show, with the optimizer shown beside it, trains a small
    model on 2 ranks and its loss falls (documented_specs_worker.py)."""
    rc, out = launch("torchrun", 2, "documented_specs_worker.py", timeout=600)
    ok = lines(out, r"rank (\d+): documented specs ok: \d+ specs")
    assert rc == 0 and sorted(set(ok)) == ["0", "1"], out[-6000:]


def test_monitor(tmp_path):
    """hopwise.torch.Monitor on DDP names the rank slowed on purpose; its metrics file passes promtool."""
    prom, jsonl = tmp_path / "ddp.prom", tmp_path / "ddp.jsonl"
    rc, out = launch("torchrun", 2, "ddp_worker.py", "monitor", env={"MONITOR_PROM": str(prom),
                                                                      "MONITOR_JSON": str(jsonl)})
    assert rc == 0 and lines(out, r"monitor ok: rank 1 named"), out[-6000:]
    assert lines(out, r"^(?:\[\S+\]:)?monitor: steps 0-29 .*slowest rank 1"), out[-6000:]
    check = subprocess.run(["promtool", "check", "metrics"], input=prom.read_text(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert check.returncode == 0, check.stdout
    kinds = [json.loads(line)["type"] for line in jsonl.read_text().splitlines()]
    assert kinds.count("step") == 30 and "interval" in kinds and "alert" in kinds, kinds


def test_elastic_shrink(tmp_path):
    """Rank 2 of 4 killed mid-run: the three survivors re-form the group (hopwise.torch.ElasticContext), re-wrap DDP,
    redo the step and finish with the same parameters on every rank."""
    rc, out = launch("spawn", 4, "elastic_worker.py", str(tmp_path / "store"), "2",
                     env={"HOPWISE_TIMEOUT_S": "10", "HOPWISE_ELASTIC": "shrink"}, timeout=240, grace=120)
    done = lines(out, r"^rank (\d): elastic ok: 3 ranks at the end, generation 1, 1 step\(s\) redone, parameters "
                      r"identical True, loss ([0-9.]+) -> ([0-9.]+)")
    assert sorted(int(r) for r, _, _ in done) == [0, 1, 3], out
    assert all(float(b) < float(a) for _, a, b in done), out
    assert lines(out, r"^elastic: generation 1: rank\(s\) 2 left; 3 rank\(s\) go on \(0, 1, 3\)"), out
    print("\n".join(l for l in out.splitlines() if "elastic" in l))


def test_elastic_grow(tmp_path):
    """A process started later (HOPWISE_ELASTIC_JOIN=1) joins 3 training ranks at the step 10 boundary: it receives
    their step, parameters and optimizer state (ElasticContext.share_state), DDP is re-wrapped over 4 ranks, and all
    4 hold the same parameters, bit for bit, after the newcomer's first step and at the end."""
    rc, out = launch("spawn", 3, "elastic_worker.py", str(tmp_path / "store"), "-1", "grow",
                     env={"HOPWISE_TIMEOUT_S": "60", "HOPWISE_ELASTIC": "shrink,grow"}, timeout=240, grace=120)
    done = lines(out, r"^rank (\d): elastic ok: 4 ranks at the end, generation 1, 0 step\(s\) redone, parameters "
                      r"identical True, loss [0-9.]+ -> [0-9.]+, re-wrap \d+ ms, identical after the newcomer's "
                      r"first step True")
    assert rc == 0 and sorted(int(r) for r in done) == [0, 1, 2, 3], out
    assert lines(out, r"^elastic: generation 1: rank\(s\) 3 joined; 4 rank\(s\) go on \(0, 1, 2, 3\)"), out
    print("\n".join(l for l in out.splitlines() if "elastic" in l))


def test_elastic_grow_newcomer_dies(tmp_path):
    """A newcomer killed (SIGKILL) right after it took its ticket: the members let it in, time out waiting for it,
    agree on who is here and go on over 3 ranks; nobody crashes."""
    rc, out = launch("spawn", 3, "elastic_worker.py", str(tmp_path / "store"), "-1", "grow-dies",
                     env={"HOPWISE_TIMEOUT_S": "5", "HOPWISE_ELASTIC": "shrink,grow"}, timeout=240, grace=120)
    done = lines(out, r"^rank (\d): elastic ok: 3 ranks at the end, generation 2, 0 step\(s\) redone, parameters "
                      r"identical True")
    assert rc == 0 and sorted(int(r) for r in done) == [0, 1, 2], out
    assert lines(out, r"^elastic: generation 2: newcomer\(s\) 3 let in but never arrived \(timed out\); 3 rank\(s\) "
                      r"go on \(0, 1, 2\)"), out
    print("\n".join(l for l in out.splitlines() if "elastic" in l))


def _elastic_diloco(tmp_path, mode, victim, env, np=3):
    rc, out = launch("spawn", np, "elastic_diloco_worker.py", str(tmp_path / "store"), mode, str(victim),
                     env=dict({"HOPWISE_ELASTIC": "shrink"}, **env), timeout=300, grace=120)
    done = lines(out, r"^rank (\d): elastic diloco ok: (\d) replicas at the end, generation (\d), parameters "
                      r"identical (\w+), loss ([0-9.]+) -> ([0-9.na]+) before the event -> ([0-9.]+) at most after -> "
                      r"([0-9.]+), steps (\d+); (.*)$")
    print("\n".join(l for l in out.splitlines() if "elastic" in l))
    return rc, out, done


@pytest.mark.parametrize("mode", ["kill-fragment", "kill-sync", "stop"])
def test_elastic_diloco_survivors(tmp_path, mode):
    """hopwise.torch.DiLoCo with ElasticContext: replica 1 of 3 killed between syncs, killed with a fragment's sync in
    flight, or stopped past the timeout. The two survivors detach, agree and regroup: the outer state goes on, the
    broken sync is redone over them, the loss goes on from where it stood (no restart: it never climbs back to the
    start), and both end on the same model, bit for bit; a stopped replica is refused by name."""
    rc, out, done = _elastic_diloco(tmp_path, mode, 1, {"HOPWISE_TIMEOUT_S": "4", "STOP_S": "14"})
    assert sorted(int(d[0]) for d in done) == [0, 2], out
    for r, replicas, generation, same, first, before, most_after, last, steps, said in done:
        assert (replicas, generation, same, steps) == ("2", "1", "True", "40"), out
        assert "the outer state kept" in said or "the outer state taken from rank" in said, said
        assert float(last) < float(first) and float(most_after) < float(first), out  # continuous, not restarted
    assert lines(out, r"^elastic: generation 1: rank\(s\) 1 left; 2 rank\(s\) go on \(0, 2\)"), out
    if mode == "stop":
        assert lines(out, r"rank 1 was left out of generation 1"), out


def test_elastic_diloco_newcomer(tmp_path):
    """A replica started later joins 3 DiLoCo replicas after the full average at step 10: it takes the synced model,
    the outer momentum and the step count from them (DiLoCo(join=True), regroup() on the members), and all 4 end on
    the same model, bit for bit."""
    rc, out, done = _elastic_diloco(tmp_path, "grow", -1, {"HOPWISE_TIMEOUT_S": "60", "HOPWISE_ELASTIC": "shrink,grow"})
    assert rc == 0 and sorted(int(d[0]) for d in done) == [0, 1, 2, 3], out
    for r, replicas, generation, same, first, before, most_after, last, steps, said in done:
        assert (replicas, generation, same, steps) == ("4", "1", "True", "40"), out
        want = "joined at step 10" if r == "3" else "sent to the newcomer(s) from rank 0"
        assert want in said, said
    assert lines(out, r"^elastic: generation 1: rank\(s\) 3 joined; 4 rank\(s\) go on \(0, 1, 2, 3\)"), out


def test_elastic_diloco_torchrun_per_replica(tmp_path):
    """Each of 3 DiLoCo replicas is its own torchrun (--max-restarts 2), naming its place (ElasticContext's replica=,
    replicas=): replica 1 kills itself at step 10; the other two go on without it, torchrun starts it again, and the
    new attempt (TORCHELASTIC_RESTART_COUNT 1) joins the running job at the step 20 boundary with the synced model,
    the outer momentum and the step; all 3 end on one model, bit for bit, and every torchrun exits 0."""
    e = dict(os.environ, PYTHONPATH=str(BUILD / "python"), OMP_NUM_THREADS="1", HOPWISE_TIMEOUT_S="5",
             HOPWISE_ELASTIC="shrink,grow")
    jobs = [subprocess.Popen([TORCHRUN, "--standalone", "--nproc_per_node", "1", "--max-restarts", "2",
                              str(HERE / "elastic_diloco_worker.py"), str(tmp_path / "store"), "torchrun", "1", str(i),
                              "3"], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in range(3)]
    outs = [j.communicate(timeout=300)[0] for j in jobs]
    out = "\n".join(outs)
    print("\n".join(l for l in out.splitlines() if "elastic" in l))
    assert [j.returncode for j in jobs] == [0, 0, 0], out[-6000:]
    done = lines(out, r"^rank (\d): elastic diloco ok: 3 replicas at the end, generation 2, parameters identical "
                      r"True, .*; (.*)$")
    assert sorted(int(r) for r, _ in done) == [0, 2, 3], out[-6000:]
    said = dict(done)
    assert "joined at step 20 (torchrun's attempt 1)" in said["3"], said
    assert "sent to the newcomer(s) from rank 0" in said["0"], said
    assert lines(out, r"^elastic: generation 1: rank\(s\) 1 left; 2 rank\(s\) go on \(0, 2\)"), out[-6000:]
    assert lines(out, r"^elastic: generation 2: rank\(s\) 3 joined; 3 rank\(s\) go on \(0, 2, 3\)"), out[-6000:]
