#!/usr/bin/env python3
"""Probes rank 0's TCP store the way anyone on its network could, while a real job waits in its rendezvous, and
prints what happened: a table of each probe, rank 0's RSS and CPU, and whether the job then still ran.

    scripts/store-probe.py build/bin/fault_driver [--port 29555]

Rank 0 is started as torchrun would start it (RANK=0, WORLD_SIZE=2, MASTER_ADDR=127.0.0.1, TORCHELASTIC_RUN_ID), and
with at most 64 open files; it waits for rank 1, which starts last, after the probes. README, "Trust and limits".
"""
import argparse
import os
import signal
import socket
import struct
import subprocess
import sys
import time

SET, GET, WAIT, ADD, CHECK, HELLO = 1, 2, 3, 4, 5, 6
JOB = "probe-job"


def frame(op, rid, keys=(), value=b"", delta=0):
    body = struct.pack("<iiqI", op, rid, delta, len(keys))
    for k in keys:
        body += struct.pack("<I", len(k)) + k
    body += struct.pack("<I", len(value)) + value
    return struct.pack("<I", len(body)) + body


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def reply(s, timeout=30):
    s.settimeout(timeout)
    buf = bytearray()
    while True:
        if len(buf) >= 4:
            (n,) = struct.unpack("<I", buf[:4])
            if len(buf) >= 4 + n:
                return buf[8], bytes(buf[9:4 + n])
        chunk = s.recv(1 << 20)
        if not chunk:
            return None, b"closed"
        buf += chunk


def introduced(port):
    s = connect(port)
    s.sendall(frame(HELLO, 1, (), JOB.encode()))
    status, _ = reply(s)
    assert status == 0, "the probe could not introduce itself"
    return s


def closed_within(s, limit):
    t0 = time.monotonic()
    s.settimeout(0.2)
    while time.monotonic() - t0 < limit:
        try:
            if not s.recv(65536):
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - t0
    return None


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def alive(proc):
    return proc.poll() is None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("program", help="a hopwise program to run as rank 0 and rank 1 (fault_driver)")
    ap.add_argument("--port", type=int, default=29555)
    a = ap.parse_args()
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(a.port), TORCHELASTIC_RUN_ID=JOB, HOPWISE_TIMEOUT_S="120", OMP_NUM_THREADS="1")
    log0 = open("/tmp/store-probe-rank0.log", "w")
    rank0 = subprocess.Popen(["prlimit", "--nofile=64", a.program, "--iters", "5"], env=env, stdout=log0,
                             stderr=subprocess.STDOUT)
    rows = []
    try:
        for _ in range(300):
            try:
                introduced(a.port).close()
                break
            except OSError:
                time.sleep(0.1)
        pid = rank0.pid
        rss0 = status_kb(pid, "VmRSS")
        rows.append(("rank 0 waiting in its rendezvous", f"RSS {rss0 / 1024:.1f} MB", ""))

        listen = subprocess.run(["ss", "-ltnH", f"sport = :{a.port}"], capture_output=True, text=True).stdout.split()
        rows.append(("where the store listens (MASTER_ADDR=127.0.0.1)", listen[3] if len(listen) > 3 else "?", ""))

        s = introduced(a.port)
        s.sendall(frame(ADD, 2, (b"hopwise/world/0/hosts/0",), delta=1))
        st, text = reply(s)
        s.sendall(frame(SET, 3, (b"probe/top",), b"9223372036854775807"))
        reply(s)
        s.sendall(frame(ADD, 4, (b"probe/top",), delta=1))
        st2, text2 = reply(s)
        rows.append(("`add` on a key holding text", f"status {st}: {text.decode()}", f"rank 0 alive: {alive(rank0)}"))
        rows.append(("`add` past INT64_MAX", f"status {st2}: {text2.decode()}", f"rank 0 alive: {alive(rank0)}"))
        s.close()

        t0 = time.monotonic()
        socks = [connect(a.port) for _ in range(4)]
        sent = [0] * 4
        for s in socks:
            s.sendall(struct.pack("<I", 0x3FFFFFFF))
            s.setblocking(False)
        chunk = b"x" * (1 << 20)
        for _ in range(1000):
            for i, s in enumerate(socks):
                try:
                    sent[i] += s.send(chunk)
                except (BlockingIOError, ConnectionResetError, BrokenPipeError):
                    pass
        closes = [closed_within(s, 30) for s in socks]
        rss = status_kb(pid, "VmRSS")
        rows.append(("4 connections: length 0x3FFFFFFF, then 1000 MiB each, before HELLO",
                     f"closed after {max(c or 99 for c in closes):.2f} s; {sum(sent) / 2**20:.1f} MiB got into "
                     f"the socket buffers", f"RSS {rss / 1024:.1f} MB"))
        h = connect(a.port)
        h.sendall(b"GET / HTTP/1.0\r\n\r\n")
        c = closed_within(h, 30)
        rows.append(("`GET / HTTP/1.0`", f"closed after {c:.3f} s" if c is not None else "held", ""))
        idle = connect(a.port)
        c = closed_within(idle, 30)
        rows.append(("a connection that says nothing", f"closed after {c:.2f} s" if c is not None else "held", ""))

        big = introduced(a.port)
        big.sendall(frame(SET, 2, (b"probe/big",), b"b" * (128 << 20)))
        reply(big, 120)
        rss_before = status_kb(pid, "VmRSS")
        for i in range(24):
            big.sendall(frame(GET, 10 + i, (b"probe/big",)))
        time.sleep(1.0)
        other = introduced(a.port)
        t0 = time.monotonic()
        other.sendall(frame(GET, 2, (b"probe/big",)))
        st, v = reply(other, 120)
        took = time.monotonic() - t0
        rss = status_kb(pid, "VmRSS")
        rows.append(("one client sets 128 MiB and sends 24 GETs without reading",
                     f"another client's GET of it: {took:.2f} s", f"RSS {rss_before / 1024:.0f} -> {rss / 1024:.0f} MB"))
        big.close()
        other.close()

        cpu0, t0 = cpu_s(pid), time.monotonic()
        idle_socks = []
        for _ in range(100):
            try:
                idle_socks.append(connect(a.port))
            except OSError:
                break
        time.sleep(3)
        used = cpu_s(pid) - cpu0
        rows.append(("`ulimit -n 64`, 100 idle connections", f"{len(idle_socks)} connected; rank 0 used {used:.2f} s "
                     f"of CPU in {time.monotonic() - t0:.1f} s", ""))
        t0 = time.monotonic()
        env1 = dict(env, RANK="1", LOCAL_RANK="1")
        rank1 = subprocess.run([a.program, "--iters", "5"], env=env1, capture_output=True, text=True, timeout=180)
        rank0.wait(timeout=60)
        rows.append(("then the real rank 1 joins, the 100 still open",
                     f"rank 1 exit {rank1.returncode}, rank 0 exit {rank0.returncode} after "
                     f"{time.monotonic() - t0:.1f} s", rank1.stdout.strip().splitlines()[-1] if rank1.stdout else ""))
        for s in idle_socks:
            s.close()
    finally:
        if alive(rank0):
            rank0.send_signal(signal.SIGKILL)
    print("| probe | what happened | rank 0 |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    log0.close()
    warnings = [l.strip() for l in open("/tmp/store-probe-rank0.log") if "WARN" in l]
    print(f"\nrank 0's warnings ({len(warnings)} lines, /tmp/store-probe-rank0.log):")
    for w in warnings:
        print("  " + w)


if __name__ == "__main__":
    sys.exit(main())
