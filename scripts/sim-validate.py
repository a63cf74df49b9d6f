#!/usr/bin/env python3
"""The simulation against the emulated cluster: hopwise-sim's allreduce times per algorithm and size beside the times
scripts/sim-measure.sh measured, for the same shapes (2 hosts x 1 and x 2, 4 hosts x 1, --map-by node).

The platform is calibrated from measurement, never fitted per row: every host on one full-duplex link of the rate
measured (the shaped rate), its latency from the 8-byte allreduce of 2 ranks (2 steps of one message each way: a
message's time is half the call's; the route crosses 2 links), SimGrid's latency and bandwidth factors 1 (hopwise-sim's
default), reductions and copies at the measuring machine's rates (compute.txt beside the measurements). Prints one
table per shape and the worst ratio; exits 1 when a ratio leaves the tolerance or a measured row was not simulated.

    scripts/sim-validate.py [--data tests/sim/emulated-1gbit] [--rate 125MBps] [--tolerance 0.15] [--algos ring,hd]
                            [--exclude ALGO[:SHAPE|*][:FROM[-TO]]]...

--exclude keeps rows out of the verdict (they are still printed, marked *): those whose difference is understood
and is not the simulation's (the README says why), e.g. --exclude one_shot:*:16M for every shape from 16 MiB.
"""
import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measured(path):
    """{(bytes, algo): time_us} from a hopwise-bench CSV."""
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            out[(int(row["size_bytes"]), row["algo"])] = float(row["time_us"])
    return out


def platform(hosts, rate, latency_us):
    return f"""<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <zone id="world" routing="Full">
    <cluster id="emulated" prefix="e" suffix="" radical="0-{hosts - 1}" speed="1Gf" bw="{rate}" lat="{latency_us:.3f}us"
             bb_bw="100GBps" bb_lat="0us" loopback_bw="5GBps" loopback_lat="1us" sharing_policy="SPLITDUPLEX"/>
  </zone>
</platform>
"""


def simulated(binary, xml, ranks, algos, sizes, compute):
    cmd = [binary, "--platform", xml, "--ranks", str(ranks), "--placement", "cyclic", "--ring", "planned",
           "-a", ",".join(algos), "-b", str(min(sizes)), "-e", str(max(sizes)), "-f", "4", "--compute", compute]
    text = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0].isdigit() and f[3].replace(".", "").isdigit():
            out[(int(f[0]), f[2])] = float(f[3])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT / "tests" / "sim" / "emulated-1gbit"))
    ap.add_argument("--rate", default="125MBps")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--algos", default="ring,hd,tree,one_shot", help="the algorithms to compare")
    ap.add_argument("--sim", default=str(ROOT / "build" / "bin" / "hopwise-sim"), help="the hopwise-sim to run")
    ap.add_argument("--exclude", action="append", default=[], help="ALGO[:SHAPE|*][:FROM[-TO]] kept out of the verdict")
    args = ap.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

    def bytes_of(t):
        return int(t[:-1]) * units[t[-1]] if t[-1] in units else int(t)

    def excluded(algo, shape, size):
        for e in args.exclude:
            parts = e.split(":")
            if parts[0] != algo or (len(parts) > 1 and parts[1] not in ("*", "", shape)):
                continue
            if len(parts) > 2 and parts[2]:
                lo, _, hi = parts[2].partition("-")
                if size < bytes_of(lo) or (hi and size > bytes_of(hi)):
                    continue
            return True
        return False

    data = Path(args.data)
    lat = measured(data / "latency.csv")
    call_us = statistics.median(v for (b, a), v in lat.items() if a == "ring")
    link_latency_us = call_us / 2 / 2  # a message's time, over the route's 2 links
    # The measuring machine's reduction and copy rates (sim-measure.sh kept them), not this machine's.
    rates = data / "compute.txt"
    compute = rates.read_text().strip() if rates.exists() else "measured"
    print(f"calibration: 8-byte allreduce of 2 ranks {call_us:.1f} us -> {link_latency_us:.2f} us a link; "
          f"links {args.rate} full duplex; reduce and copy at {compute}")
    worst, missing = 1.0, []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in ("2x1", "2x2", "4x1"):
            hosts, per = (int(x) for x in shape.split("x"))
            real = measured(data / f"{shape}.csv")
            algos = sorted({a for (_, a) in real if a in args.algos.split(",")})
            sizes = sorted({b for (b, _) in real})
            xml = Path(tmp) / f"{shape}.xml"
            xml.write_text(platform(hosts, args.rate, link_latency_us))
            sim = simulated(args.sim, str(xml), hosts * per, algos, sizes, compute)
            print(f"\n{shape} ({hosts} hosts x {per} ranks): simulated / measured")
            print("| bytes | " + " | ".join(algos) + " |")
            print("|---:|" + "---:|" * len(algos))
            for b in sizes:
                cells = []
                for a in algos:
                    if (b, a) in sim and (b, a) in real:
                        r = sim[(b, a)] / real[(b, a)]
                        if excluded(a, shape, b):
                            cells.append(f"{r:.3f}*")
                            continue
                        worst = max(worst, r, 1 / r)
                        cells.append(f"{r:.3f}")
                    else:
                        cells.append("-")
                        if (b, a) in real and not excluded(a, shape, b):
                            missing.append(f"{a} {b} at {shape}")
                print(f"| {b} | " + " | ".join(cells) + " |")
    print(f"\nworst ratio {worst:.3f} (tolerance {1 + args.tolerance:.2f})"
          + (f"; * kept out: {', '.join(args.exclude)}" if args.exclude else ""))
    if missing:
        print(f"not simulated: {', '.join(missing)}")
    return 0 if worst <= 1 + args.tolerance and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
