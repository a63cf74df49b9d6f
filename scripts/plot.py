#!/usr/bin/python3
"""Charts of hopwise's outputs: each FILE's chart is written as a PNG beside it, and its path printed.

  scripts/plot.py FILE...

  a hopwise-bench CSV (--csv) or JSON lines (--metrics-json)
      bus bandwidth against size, a line per algorithm; MPI's and Gloo's rows of the same run dashed beside them
  a monitor's JSON lines (train_mnist --metrics-json, HOPWISE_METRICS_JSON)
      per step and rank: compute utilization, and exposed communication in ms; alerts marked
  a Chrome/Perfetto trace (train_mnist --trace)
      a few steps of every rank: compute and the buckets' communication on their own rows, to see the overlap

  scripts/plot.py --grid OUT.png [--title TEXT] CSV...
      one panel per CSV (hopwise-bench's or hopwise-sim's), titled by its file name: bus bandwidth against size,
      a line per algorithm, the panels side by side with one y scale (e.g. one fabric at 16 to 4096 ranks)

Uses Debian's python3-matplotlib (scripts/setup.sh installs it); no display needed.
"""
import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

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


def training_chart(records, title, out):
    steps = [r for r in records if r.get("type") == "step"]
    alerts = [r for r in records if r.get("type") == "alert"]
    intervals = [r for r in records if r.get("type") == "interval"]
    if not steps:
        raise ValueError("no step records (type \"step\") in it")
    x = [r["step"] for r in steps]
    ranks = len(steps[0]["utilization"])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for k in range(ranks):
        top.plot(x, [100 * r["utilization"][k] for r in steps], linewidth=1, label=f"rank {k}")
        bottom.plot(x, [r["exposed_ms"][k] for r in steps], linewidth=1, label=f"rank {k}")
    for a in alerts:  # the interval whose end raised the alert
        for ax in (top, bottom):
            ax.axvspan(a["first_step"], a["first_step"] + a.get("steps", 1), color="red", alpha=0.08)
    if alerts:
        cause = alerts[0]["cause"]
        cause = cause if len(cause) <= 95 else cause[:cause.rfind(" ", 0, 95)] + " ..."
        top.text(alerts[0]["first_step"], 102, " alert: " + cause, color="red", fontsize=7, va="bottom")
    top.set_ylabel("compute utilization (%)")
    top.set_ylim(0, 110)
    bottom.set_ylabel("exposed communication (ms)")
    bottom.set_xlabel("step")
    if intervals:
        last = intervals[-1]
        title += f" — last interval: slowest rank {last['slowest_rank']}, {last['slowest_lag_ms']:.1f} ms late per step"
    top.set_title(title, fontsize=10)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=min(ranks, 8), loc="lower right" if ax is top else "upper right")
    fig.tight_layout()
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


def read_json_any(path):
    text = Path(path).read_text()
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def plot(path):
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
    if isinstance(first, dict) and "traceEvents" in first:
        trace_chart(first["traceEvents"], p.name, out)
    elif isinstance(first, list):
        trace_chart(first, p.name, out)
    elif any(r.get("type") == "bench" for r in records):
        rows = [r for r in records if r.get("type") == "bench"]
        bench_chart(rows, f"{p.name}: {rows[0]['collective']} bus bandwidth, {rows[0]['ranks']} ranks", out)
    elif any(r.get("type") == "step" for r in records):
        training_chart(records, p.name, out)
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
    failed = 0
    for path in argv:
        try:
            print(plot(path))
        except (OSError, ValueError, KeyError) as e:
            print(f"plot.py: {path}: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
