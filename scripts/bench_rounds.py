"""What the training benchmarks share: rows run interleaved over rounds (forward, then backward, so no row always
runs first or last on a shared, noisy machine), medians of what was measured, and the figures of a table row."""
import json
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
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def medians(runs, keys):
    return {r: {k: median([x[k] for x in rs]) for k in keys} for r, rs in runs.items()}


def each(rs, key, fmt=".1f"):
    """Every run's figure, in the order run: '9.7, 10.9, 11.7' ('-' for a run that did not get there)."""
    return ", ".join("-" if x[key] is None else format(x[key], fmt) for x in rs)


def speedup(ddp, m):
    """DDP's median time to the target over the row's, or '-' where either did not reach it."""
    if not ddp or not ddp["seconds_to_target"] or not m["seconds_to_target"]:
        return "-"
    return f"{ddp['seconds_to_target'] / m['seconds_to_target']:.2f}x"
