#!/usr/bin/python3
"""Charts of hopwise's outputs: each FILE's chart is written as a PNG beside it, and its path printed.

  scripts/plot.py [--util-alert X] FILE...

  a hopwise-bench CSV (--csv) or JSON lines (--metrics-json)
      bus bandwidth against size, a line per algorithm; MPI's and Gloo's rows of the same run dashed beside them
  a monitor's JSON lines (train_mnist --metrics-json, HOPWISE_METRICS_JSON)
      per rank, compute utilization and exposed communication (ms per step): a rolling median over ~2% of the steps,
      a 10th-90th percentile band; the straggler (named slowest by the most intervals) thick; alerts shaded. The
      alert threshold, dashed: --util-alert X (0.5 or 50%, as HOPWISE_UTIL_ALERT takes it), else the intervals'
      util_alert field, else the alert lines' "below N%" (the monitor's default, 0, has none). Exposed comm has none.
  a Chrome/Perfetto trace (train_mnist --trace)
      a few steps of every rank: compute and the buckets' communication on their own rows, to see the overlap

  a bench-lm JSON (scripts/bench-lm.py --json)
      validation loss (bits per byte, up to 1.5x the target) against training seconds (log), a line per row (its
      run of median length) from its first check on, DDP's thick and black, DDP's loss + 1% dashed; beside it each
      row's compute utilization as a bar

  scripts/plot.py --grid OUT.png [--title TEXT] CSV...
      one panel per CSV (hopwise-bench's or hopwise-sim's), titled by its file name: bus bandwidth against size,
      a line per algorithm, the panels side by side with one y scale (e.g. one fabric at 16 to 4096 ranks)

Uses Debian's python3-matplotlib (scripts/setup.sh installs it); no display needed.
"""
import bisect
import csv
import json
import re
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

PEERS = {"mpi": "MPI's own", "gloo": "Gloo"}


def human_bytes(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n:g}"


def bench_chart(rows, title, out):
    """rows: dicts with size_bytes, algo, busbw_gbs (and codec)."""
    lines = {}
    for r in rows:
        name = r["algo"] if r.get("codec", "none") in ("none", "-", "") else f'{r["algo"]} {r["codec"]}'
        lines.setdefault(name, []).append((int(r["size_bytes"]), float(r["busbw_gbs"])))
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, pts in sorted(lines.items(), key=lambda kv: (kv[0] in PEERS, kv[0])):
        pts.sort()
        peer = name in PEERS
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "--" if peer else "-", marker="o", markersize=3,
                linewidth=2.2 if peer else 1.4, color="black" if name == "mpi" else ("gray" if peer else None),
                label=PEERS.get(name, f"hopwise {name}"))
    sizes = sorted({s for pts in lines.values() for s, _ in pts})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([human_bytes(s) for s in sizes], rotation=45)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def grid_chart(paths, title, out):
    """A panel per CSV, a line per algorithm; one legend, one y scale."""
    cols = min(len(paths), 3)
    rows_n = (len(paths) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.6 * cols, 3.6 * rows_n), sharey=True, squeeze=False)
    colors = {}
    for i, path in enumerate(paths):
        ax = axes[i // cols][i % cols]
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        lines = {}
        for r in rows:
            lines.setdefault(r["algo"], []).append((int(r["size_bytes"]), float(r["busbw_gbs"])))
        for name, pts in sorted(lines.items()):
            pts.sort()
            color = "black" if name == "auto" else colors.setdefault(name, f"C{len(colors)}")
            colors.setdefault(name, color)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "--" if name == "auto" else "-", marker="o",
                    markersize=2.5, linewidth=1.0 if name == "auto" else 1.3, color=color, label=name)
        sizes = sorted({s for pts in lines.values() for s, _ in pts})
        ax.set_xscale("log", base=2)
        if sizes:
            step = max(1, len(sizes) // 6)
            ax.set_xticks(sizes[::step])
            ax.set_xticklabels([human_bytes(s) for s in sizes[::step]], rotation=45, fontsize=7)
        ax.set_title(Path(path).stem, fontsize=9)
        ax.grid(True, alpha=0.3)
        if i % cols == 0:
            ax.set_ylabel("bus bandwidth (GB/s)")
    for j in range(len(paths), rows_n * cols):
        axes[j // cols][j % cols].axis("off")
    handles = [plt.Line2D([], [], color=c, marker="o", markersize=3, linestyle="--" if n == "auto" else "-", label=n)
               for n, c in sorted(colors.items())]
    fig.legend(handles=handles, loc="upper right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.93, 0.95))
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def rolling(values, width, qs):
    """Centred rolling quantiles (a list per q in qs) over an odd window, shorter at the ends; plain Python."""
    half, window, out = width // 2, sorted(values[:width // 2]), [[] for _ in qs]
    for i in range(len(values)):
        if i + half < len(values):
            bisect.insort(window, values[i + half])
        if i - half - 1 >= 0:
            window.pop(bisect.bisect_left(window, values[i - half - 1]))
        for o, q in zip(out, qs):
            at = q * (len(window) - 1)
            lo = int(at)
            o.append(window[lo] + (window[min(lo + 1, len(window) - 1)] - window[lo]) * (at - lo))
    return out


def monitor_series(records):
    """Steps on one axis: an elastic job's new monitor counts its steps from 0 again (and continues the file), so each
    generation is moved past the one before. Returns per-rank series and the interval and alert records, moved alike."""
    series, intervals, alerts, events = {}, [], [], []
    offset, last = 0, -1
    for r in records:
        kind = r.get("type")
        if kind == "step":
            if r["step"] + offset <= last:
                offset = last + 1 - r["step"]
            last = x = r["step"] + offset
            for key in ("utilization", "exposed_ms"):
                for k, v in enumerate(r[key]):
                    if v is not None:  # NaN is written as null
                        series.setdefault((key, k), []).append((x, 100 * v if key == "utilization" else v))
        elif kind in ("interval", "alert"):
            (intervals if kind == "interval" else alerts).append(dict(r, first_step=r["first_step"] + offset))
        elif kind == "elastic":
            events.append(last + 1)
    return series, intervals, alerts, events, last + 1


def training_chart(records, title, out, util_alert=0.0):
    series, intervals, alerts, events, n = monitor_series(records)
    if not series:
        raise ValueError("no step records (type \"step\") in it")
    ranks = 1 + max(k for _, k in series)
    width = max(1, round(0.02 * n)) | 1  # ~2% of the run, odd so the window is centred on its step
    # The straggler: the rank the intervals name slowest most often, counting those where a rank lagged at all
    # (with none lagging the monitor names rank 0); without interval records, the most lagging rank per step.
    votes = [(i["slowest_rank"], i) for i in intervals if i.get("slowest_lag_ms", 0) > 0]
    if not intervals:
        lags = [[v or 0 for v in r["lag_ms"]] for r in records if r.get("type") == "step" and r.get("lag_ms")]
        votes = [(l.index(max(l)), None) for l in lags if max(l) > 0]
    named = [k for k, _ in votes]
    straggler = max(sorted(set(named)), key=named.count) if ranks > 1 and named else None
    # The threshold: the flag, else the intervals' util_alert (the monitor writes the one it held them to), else an
    # alert line's "below N%" (files from before the field).
    if not util_alert:
        util_alert = next((i["util_alert"] for i in intervals if i.get("util_alert")), 0.0)
    if not util_alert:
        found = [re.search(r"below (\d+(?:\.\d+)?)%", a.get("line", "")) for a in alerts]
        util_alert = next((float(m.group(1)) / 100 for m in found if m), 0.0)
    many = ranks > 10  # past tab10's colours: the others in grey under one legend entry
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7.5), sharex=True)
    for k in range(ranks):
        is_s = k == straggler
        color = ("#d62728" if is_s else "0.6") if many else f"C{k}"
        label = f"rank {k}" if not many else ("other ranks" if k == min(set(range(ranks)) - {straggler}) else None)
        if is_s:
            of = f"{len(intervals)} intervals" if intervals else f"{len(named)} lagging steps"
            label = f"rank {k} (straggler: slowest in {named.count(k)} of {of})"
        for ax, key in ((top, "utilization"), (bottom, "exposed_ms")):
            if (key, k) not in series:
                continue
            xs, ys = zip(*series[(key, k)])
            lo, mid, hi = rolling(ys, width, (0.1, 0.5, 0.9))
            ax.fill_between(xs, lo, hi, color=color, alpha=0.05 if many and not is_s else 0.12, linewidth=0)
            ax.plot(xs, mid, color=color, linewidth=2.6 if is_s else 1.2, label=label, zorder=3 if is_s else 2,
                    marker="o" if n <= 30 else None, markersize=3)
    if straggler is not None and intervals and named.count(straggler) < len(intervals):
        # Named in some intervals only: a tick along the top for each interval that named it.
        at = [i["first_step"] + i["steps"] / 2 for k, i in votes if k == straggler]
        top.plot(at, [0.97] * len(at), "|", color=f"C{straggler}" if not many else "#d62728", markersize=9,
                 markeredgewidth=2, transform=top.get_xaxis_transform(), label=f"rank {straggler} named slowest")
    if intervals:  # what the alert compares: the ranks' mean over each interval
        xs = [i["first_step"] for i in intervals] + [intervals[-1]["first_step"] + intervals[-1]["steps"]]
        ys = [100 * i["utilization"] for i in intervals]
        top.step(xs, ys + ys[-1:], where="post", color="k", linewidth=0.9, alpha=0.7,
                 label="interval mean of ranks (alerts compare it)")
    if util_alert > 0:
        top.axhline(100 * util_alert, color="k", linestyle="--", linewidth=1.2,
                    label=f"utilization alert threshold {100 * util_alert:g}%")
    for j, a in enumerate(alerts):  # the interval whose end raised the alert
        for ax in (top, bottom):
            ax.axvspan(a["first_step"], a["first_step"] + a.get("steps", 1), color="red", alpha=0.1, linewidth=0,
                       label="alert raised (its interval)" if j == 0 and ax is top else None)
    for e in events:
        for ax in (top, bottom):
            ax.axvline(e, color="purple", linestyle=":", linewidth=1.2,
                       label="membership change (elastic)" if e == events[0] and ax is top else None)
    if alerts:
        a = alerts[-1]
        cause = a.get("cause", "")
        cause = cause if len(cause) <= 140 else cause[:cause.rfind(" ", 0, 140)] + " ..."
        fig.text(0.01, 0.005, f"last alert (steps {a['first_step']}-{a['first_step'] + a.get('steps', 1) - 1}): "
                 f"{cause}", color="red", fontsize=8)
    pad = 0.5 if n <= 30 else 0  # a short run's markers whole at the edges
    top.set(ylabel="compute utilization (% of step)", ylim=(0, 105))
    bottom.set(ylabel="exposed communication (ms per step)", ylim=(0, None), xlabel="step",
               xlim=(-pad, max(n - 1, 1) + pad))
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    smooth = f"rolling median over {width} steps (line), 10th-90th percentile (band)" if width > 1 else "every step"
    what = ", ".join(f"{c} {w}{'s' * (c != 1)}" for c, w in ((ranks, "rank"), (n, "step"), (len(intervals), "interval"))
                     if c)
    top.set_title(f"{title}: {what}\nper rank: {smooth}", fontsize=10)
    bottom.set_title("exposed communication: the part of the step compute did not hide (no alert threshold)"
                     + ("; the others wait here for a straggler" if ranks > 1 else ""), fontsize=9)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.tight_layout(rect=(0, 0.02 if alerts else 0, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def trace_chart(events, title, out, steps=4):
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise ValueError("no spans (\"ph\": \"X\") in the trace")
    # A window of a few steps after the first ones (which rebuild buckets and tune): from the 10th forward on.
    forwards = sorted(e["ts"] for e in spans if e["name"] == "forward" and e["pid"] == 0)
    start = forwards[min(10, len(forwards) - 1)] if forwards else min(e["ts"] for e in spans)
    end_i = min(len(forwards) - 1, 10 + steps) if forwards else 0
    end = forwards[end_i] if forwards and end_i > 10 else start + 200e3
    ranks = sorted({e["pid"] for e in spans})
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.8 * len(ranks)))
    colors = {"compute": "#4c72b0", "comm": "#dd8452"}
    labels = []
    for i, r in enumerate(ranks):
        for tid, row in ((0, 2 * i + 1), (1, 2 * i)):
            for e in spans:
                if e["pid"] != r or e["tid"] != tid or e["ts"] + e["dur"] < start or e["ts"] > end:
                    continue
                if e["name"].startswith("finish"):
                    color = "#c44e52"  # the exposed wait
                else:
                    color = colors.get(e.get("cat"), "gray")
                ax.broken_barh([((e["ts"] - start) / 1e3, e["dur"] / 1e3)], (row - 0.4, 0.8), facecolors=color)
        labels += [f"rank {r} comm", f"rank {r} compute"]
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("ms")
    ax.set_title(title + " — blue: compute, orange: bucket allreduce, red: waiting (exposed)", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def lm_chart(bench, title, out):
    """scripts/bench-lm.py's rows: loss against time, and utilization."""
    runs, labels, ref = bench["runs"], bench["labels"], bench["compute_ms"]
    reference = bench["args"].get("reference", "ddp")  # the row every other is measured against, drawn black
    fig, (curves, bars) = plt.subplots(1, 2, figsize=(15, 8), gridspec_kw={"width_ratios": [3, 2]})
    colors = plt.get_cmap("tab20").colors
    for i, (row, rs) in enumerate(runs.items()):
        typical = sorted(rs, key=lambda m: m["train_s"])[len(rs) // 2]
        points = [(s, b) for _, s, b in typical["trace"] if s > 0]  # the log axis has no 0: from the first check
        xs, ys = [s for s, _ in points], [b for _, b in points]
        ddp = row == reference
        curves.plot(xs, ys, color="black" if ddp else colors[i % len(colors)], lw=3 if ddp else 1.5,
                    label=labels.get(row, row), zorder=3 if ddp else 2)
    curves.axhline(bench["target_bpb"], color="black", ls="--", lw=1,
                   label=f"{labels.get(reference, reference)}'s final loss + 1%")
    curves.set_xscale("log")
    curves.set_xlabel("training seconds (log)")
    curves.set_ylabel("validation loss, bits per byte")
    curves.set_ylim(top=min(8.5, curves.get_ylim()[1], max(5.0, 1.5 * bench["target_bpb"])))  # where rows part
    curves.grid(alpha=0.3)
    fig.legend(*curves.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)  # below: off the curves
    names = [labels.get(r, r) for r in runs]
    util = [min(1.0, ref / statistics.median(m["step_ms"] for m in rs)) for rs in runs.values()]
    bars.barh(names, [100 * u for u in util], color=["black" if r == reference else "tab:blue" for r in runs])
    bars.axvline(90, color="tab:red", ls="--", lw=1)
    bars.invert_yaxis()
    bars.set_xlim(0, 100)
    bars.set_xlabel("compute utilization, % (goal: 90, dashed)")
    bars.tick_params(axis="y", labelsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def read_json_any(path):
    text = Path(path).read_text()
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def plot(path, util_alert=0.0):
    p = Path(path)
    out = p.with_name(p.name + ".png")  # bench.csv.png: a CSV and JSON lines of one stem keep their own charts
    if p.suffix == ".csv":
        with open(p, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows or "busbw_gbs" not in rows[0]:
            raise ValueError("not a hopwise-bench CSV (no busbw_gbs column)")
        bench_chart(rows, f"{p.name}: allreduce bus bandwidth, {rows[0].get('ranks', '?')} ranks", out)
        return out
    records = read_json_any(p)
    first = records[0]
    if isinstance(first, dict) and first.get("kind") == "bench-lm":
        a = first["args"]
        lm_chart(first, f"{p.name}: the language model on {a['hosts']} x {a['ranks_per_host']} ranks"
                 f"{', ' + a['link'] if a.get('link') else ''}", out)
    elif isinstance(first, dict) and "traceEvents" in first:
        trace_chart(first["traceEvents"], p.name, out)
    elif isinstance(first, list):
        trace_chart(first, p.name, out)
    elif any(r.get("type") == "bench" for r in records):
        rows = [r for r in records if r.get("type") == "bench"]
        bench_chart(rows, f"{p.name}: {rows[0]['collective']} bus bandwidth, {rows[0]['ranks']} ranks", out)
    elif any(r.get("type") == "step" for r in records):
        training_chart(records, p.name, out, util_alert)
    else:
        raise ValueError("neither a bench CSV or JSON lines, nor a monitor's JSON lines, nor a trace")
    return out


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if argv[0] == "--grid":
        if len(argv) < 3:
            print("plot.py --grid OUT.png [--title TEXT] CSV...", file=sys.stderr)
            return 2
        out, rest, title = argv[1], argv[2:], ""
        if rest[0] == "--title" and len(rest) >= 3:
            title, rest = rest[1], rest[2:]
        print(grid_chart(rest, title, out))
        return 0
    util_alert = 0.0  # the monitor's default: no threshold
    if argv[0] == "--util-alert" and len(argv) >= 2:
        text, argv = argv[1], argv[2:]
        try:  # as the monitor reads HOPWISE_UTIL_ALERT
            util_alert = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            util_alert = -1
        if not 0 <= util_alert <= 1 or not argv:
            print(f"plot.py --util-alert {text} FILE...: a fraction (0.5) or a percentage (50%)", file=sys.stderr)
            return 2
    failed = 0
    for path in argv:
        try:
            print(plot(path, util_alert))
        except (OSError, ValueError, KeyError) as e:
            print(f"plot.py: {path}: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
