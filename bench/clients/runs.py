#!/usr/bin/env python3
"""N runs of /usr/bin/true from one Python process, one of three ways:

  --via client   session.run(["/usr/bin/true"]) of the condfs Python client:
                 the stdio passed to the daemon as descriptors, no process
                 started here
  --via cli      condfs run --session ID -- /usr/bin/true, a process per run
  --via bwrap    bubblewrap (--unshare-all) with the same binds: the view's
                 workspace/ and memories/, a read-only /usr, /proc, /dev, a
                 tmpfs /tmp, every capability dropped

Each way is timed per run here (time.perf_counter, the output's end waited
for, as an agent runtime waits for it) and, as a whole process, by whatever
times the command. bench/clients/bench.sh starts a daemon and runs all three.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

from condfs import Client  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--via", choices=("client", "cli", "bwrap"), required=True)
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--session", default="bench")
    ap.add_argument("--mount", required=True, help="the session's view (for bwrap's binds)")
    ap.add_argument("--condfs", default="condfs")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    argv = ["/usr/bin/true"]
    client = Client(a.socket)
    session = client.session(a.session)
    cli = [a.condfs, "run", "--socket", a.socket, "--session", a.session, "--", *argv]
    bwrap = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
             "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
             "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             "--bind", os.path.join(a.mount, "workspace"), "/workspace",
             "--bind", os.path.join(a.mount, "memories"), "/memories",
             "--chdir", "/workspace", "--cap-drop", "ALL", "--", *argv]
    times = []
    for _ in range(a.n):
        start = time.perf_counter()
        if a.via == "client":
            r = session.run(argv)
            code = r.exit_code
        else:
            p = subprocess.run(cli if a.via == "cli" else bwrap, stdin=subprocess.DEVNULL, capture_output=True)
            code = p.returncode
        times.append(time.perf_counter() - start)
        if code != 0:
            sys.exit(f"{a.via}: exit {code}")
    if not a.quiet:
        ms = sorted(t * 1000 for t in times)
        print(f"{a.via}: {a.n} runs, median {statistics.median(ms):.2f} ms, lowest {ms[0]:.2f}, highest {ms[-1]:.2f}")


if __name__ == "__main__":
    main()
