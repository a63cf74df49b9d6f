"""What the training benchmarks share: rows run interleaved over rounds (forward, then backward, so no row always
runs first or last on a shared, noisy machine), medians of what was measured, and the figures of a table row.

Every run counts: a run that never reached the target is a time of +infinity, not a run left out, so a row that
reached it in 1 of 3 runs has a median of "not reached", not that one run's time (median_reached, reached)."""
import json
import math
import statistics
import sys


def interleaved(rows, rounds, run_one, target, partial="", describe=None, done=None):
    """{row: [run's figures, ...]}; run_one(row, round) measures one run. Prints each run as it ends (describe(m):
    its figures in words, else its time to the target accuracy) and, with partial, rewrites that JSON file after
    each (an interrupted sitting keeps what it measured). done: such a file's runs, {row: [...]}; the runs it holds
    are kept, not run again (an interrupted sitting goes on)."""
    runs = {r: list((done or {}).get(r, [])) for r in rows}
    for rnd in range(rounds):
        for r in rows if rnd % 2 == 0 else rows[::-1]:
            if len(runs[r]) > rnd:
                continue
            m = run_one(r, rnd)
            runs[r].append(m)
            if partial:
                with open(partial, "w") as fh:
                    json.dump(runs, fh, indent=1)
            text = describe(m) if describe else (f"{m['step_ms']:.1f} ms/step, to {target:.0%}: "
                                                 f"{m['seconds_to_target']} s, accuracy {m['accuracy']:.4f}")
            print(f"round {rnd + 1}: {r}: {text}", file=sys.stderr, flush=True)
    return runs


def median(xs):
    """The median of the figures there are: for what every completed run measures (step ms, accuracy), or what some
    rows do not measure at all (None: bytes on gloo). Never for a time to the target: median_reached."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def median_reached(runs, key):
    """The median of every run's time to the target (runs' key), a run that never reached it (None) counting as
    +infinity; None where that median is (the row did not reach the target in most of its runs)."""
    if not runs:
        return None
    m = statistics.median(math.inf if x[key] is None else x[key] for x in runs)  # even n: (t + inf) / 2 is inf
    return None if math.isinf(m) else m


def reached(runs, key):
    """How many runs reached the target (runs' key not None), out of all: '2 of 3'."""
    return f"{sum(x[key] is not None for x in runs)} of {len(runs)}"


def medians(runs, keys, reach=()):
    """{row: {key: its median}}; a key in reach is a time to the target, its median over every run (median_reached)."""
    return {r: {k: median_reached(rs, k) if k in reach else median([x[k] for x in rs]) for k in keys}
            for r, rs in runs.items()}


def megabytes(m):
    """A row's MB/step: what the host's link sent per step per rank (link_bytes_per_step) where it was measured, else
    what a rank handed its collectives (bytes_per_step); '-' where neither was."""
    b = m.get("link_bytes_per_step")
    b = m.get("bytes_per_step") if b is None else b
    return "-" if b is None else f"{b / 1e6:.2f}"


def each(rs, key, fmt=".1f"):
    """Every run's figure, in the order run: '9.7, 10.9, 11.7' ('-' for a run that did not get there)."""
    return ", ".join("-" if x[key] is None else format(x[key], fmt) for x in rs)


def speedup(ddp, m):
    """The reference's (DDP's) median time to the target over the row's, both medians over every run
    (median_reached), or '-' where either did not reach it."""
    if not ddp or not ddp["seconds_to_target"] or not m["seconds_to_target"]:
        return "-"
    return f"{ddp['seconds_to_target'] / m['seconds_to_target']:.2f}x"


def auto_said(d):
    """What diloco:auto said in a run's JSON (train.py's diloco_stats): its pick and its last decision, for the run's
    record."""
    st = d.get("diloco_stats") or {}
    return {"pick": st.get("pick", ""), "choice": st.get("choice", "")}


def auto_lines(m):
    """The pick, then the last decision where it differs: what to print of a run's auto_said()."""
    return list(dict.fromkeys(x for x in (m.get("pick"), m.get("choice")) if x))
