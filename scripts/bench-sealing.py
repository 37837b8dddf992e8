#!/usr/bin/env python3
"""What sealing frames costs: `intact send --verify none` of one file to a
fresh `intact serve` on loopback, keyless (plain frames), keyed with
`serve --no-encrypt` (authenticated only) and keyed (encrypted), RUNS
interleaved runs each. Source and destination live in DIR (default
/dev/shm: tmpfs, so no disk time hides the cipher's; the worst case for
the ratio). The page cache is not dropped. CPU = user + system seconds of
both processes (the server's read from /proc before it is stopped).

usage: scripts/bench-sealing.py [INTACT_BINARY] [MIB] [RUNS] [DIR] [STREAMS]
(defaults: target/release/intact, 1024, 7, /dev/shm, 1)
"""

import os
import shutil
import statistics
import subprocess
import sys
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/intact"
MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 7
BASE = os.path.join(sys.argv[4] if len(sys.argv) > 4 else "/dev/shm", "intact-bench-sealing")
STREAMS = sys.argv[5] if len(sys.argv) > 5 else "1"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def run(config, src, key):
    root = os.path.join(BASE, "dst")
    shutil.rmtree(root, ignore_errors=True)
    serve = [BIN, "serve", "--listen", "127.0.0.1:0", "--root", root]
    send = [BIN, "send", "--verify", "none", "--streams", STREAMS]
    if config != "plain":
        serve += ["--key-file", key]
        send += ["--key-file", key]
    if config == "authenticated":
        serve += ["--no-encrypt"]
    server = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = server.stdout.readline()
    addr = line.split("listening on ")[1].split(",")[0]
    t0 = time.monotonic()
    client = subprocess.Popen(send + [src, addr], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(client.pid, 0)
    wall = time.monotonic() - t0
    server_cpu = cpu_of(server.pid)
    server.kill()
    server.wait()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{config}: send failed: {client.stderr.read().decode()}")
    got = os.path.getsize(os.path.join(root, "big.dat"))
    assert got == MIB << 20, got
    return wall, usage.ru_utime + usage.ru_stime + server_cpu


def main():
    os.makedirs(BASE, exist_ok=True)
    src = os.path.join(BASE, "big.dat")
    with open(src, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(MIB):
            f.write(block)
    key = os.path.join(BASE, "key")
    subprocess.run([BIN, "keygen", "--force", key], check=True, stdout=subprocess.DEVNULL)
    configs = ["plain", "authenticated", "encrypted"]
    samples = {c: [] for c in configs}
    for r in range(RUNS):
        for c in configs:
            samples[c].append(run(c, src, key))
    print(f"intact send --verify none, {MIB} MiB, --streams {STREAMS}, {RUNS} interleaved runs, in {BASE}")
    print(f"{'frames':<15} {'wall s (min/med/max)':<24} {'MiB/s med':>9} {'CPU s (min/med/max)':<24}")
    med = {}
    for c in configs:
        w = [s[0] for s in samples[c]]
        u = [s[1] for s in samples[c]]
        med[c] = (statistics.median(w), statistics.median(u))
        print(
            f"{c:<15} {min(w):6.2f} {med[c][0]:6.2f} {max(w):6.2f}      {MIB / med[c][0]:9.0f} "
            f"{min(u):6.2f} {med[c][1]:6.2f} {max(u):6.2f}"
        )
    for c in configs[1:]:
        print(
            f"{c} / plain: wall x{med[c][0] / med['plain'][0]:.3f}, "
            f"CPU x{med[c][1] / med['plain'][1]:.3f} (+{med[c][1] - med['plain'][1]:.2f} s)"
        )
    shutil.rmtree(BASE, ignore_errors=True)


if __name__ == "__main__":
    main()
