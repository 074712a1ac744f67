#!/usr/bin/env python3
"""A stranger's flood: 10 050 idle TCP connections from 127.0.0.2 to one node's port, re-opened as
fast as the node closes them, for 40 s, while a client with a token on 127.0.0.1 runs
`conch sema` through that node every 0.5 s (a new connection per call). Reports the calls served
per 5 s window, the stranger connections opened and closed, and the flooded node's RSS; exits
non-zero if a call failed from 15 s on.

    scripts/front-door-flood.py target/debug            # one node, its client port
    scripts/front-door-flood.py target/release --peer   # three nodes, node 2's peer port

`--peer` starts three nodes with their peer service on ports of their own (`--peer-listen`) and
floods node 2's peer port; the client's calls go to node 2's client port, so they are served only
while node 2 keeps its place in the cluster (its forward to the leader, the leader's
replication to it). Both modes run with access control on and a peer secret, and conchd's
defaults otherwise (at most 1 000 connections per source address). Every node started is
stopped at the end, also when the run fails.
"""
import asyncio
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time

FLOOD = 10_050
SECONDS = 40


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def private_file(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


class Cluster:
    """One node, or three with separate peer ports; all with access control and a peer secret."""

    def __init__(self, bin_dir, nodes, peer_ports):
        self.bin_dir = bin_dir
        self.dir = tempfile.mkdtemp(prefix="conch-flood-")
        self.token = "x" * 16 + os.urandom(16).hex()
        private_file(f"{self.dir}/token", self.token)
        private_file(f"{self.dir}/secret", os.urandom(24).hex())
        self.client = [free_port() for _ in range(nodes)]
        self.peer = [free_port() for _ in range(nodes)] if peer_ports else self.client
        members = ",".join(f"{i + 1}=127.0.0.1:{self.peer[i]}" for i in range(nodes))
        self.procs = []
        for i in range(nodes):
            args = [f"{bin_dir}/conchd", "--id", str(i + 1), "--data-dir", f"{self.dir}/node{i + 1}",
                    "--listen", f"127.0.0.1:{self.client[i]}", "--metrics-listen", "127.0.0.1:0",
                    "--ui-listen", "off",
                    "--bootstrap-admin-token-file", f"{self.dir}/token",
                    "--peer-secret-file", f"{self.dir}/secret"]
            if peer_ports:
                args += ["--peer-listen", f"127.0.0.1:{self.peer[i]}"]
            if nodes > 1:
                args += ["--initial-cluster", members]
            log = open(f"{self.dir}/node{i + 1}.log", "w")
            self.procs.append(subprocess.Popen(args, stderr=log, stdout=log))

    def rss(self, i):
        with open(f"/proc/{self.procs[i].pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) // 1024
        return 0

    def call(self, i):
        env = dict(os.environ, CONCH_ENDPOINTS=f"127.0.0.1:{self.client[i]}", CONCH_TOKEN=self.token)
        r = subprocess.run([f"{self.bin_dir}/conch", "--timeout", "3s", "sema", "flood-check",
                            "--max", "1", "--", "true"], env=env, capture_output=True, text=True)
        return r.returncode, r.stderr.strip()[:160]

    def log_tail(self, i):
        with open(f"{self.dir}/node{i + 1}.log") as f:
            return f.read()[-2000:]

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def stranger(port, stop, counts):
    """One idle connection from 127.0.0.2, opened again as soon as the node closes it."""
    while not stop.is_set():
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        except OSError:
            await asyncio.sleep(0.05)
            continue
        counts["opened"] += 1
        try:
            while not stop.is_set():
                try:
                    if not await asyncio.wait_for(r.read(64), 1):
                        break
                except asyncio.TimeoutError:
                    continue
        except OSError:
            pass
        counts["closed"] += 1
        w.close()


async def flood(cluster, node, port):
    stop = asyncio.Event()
    counts = {"opened": 0, "closed": 0}
    results = []
    base = cluster.rss(node)
    peak = [base]

    def client_loop(t0):
        while time.time() - t0 < SECONDS:
            rc, err = cluster.call(node)
            results.append((time.time() - t0, rc, err))
            peak[0] = max(peak[0], cluster.rss(node))
            time.sleep(0.5)

    tasks = [asyncio.create_task(stranger(port, stop, counts)) for _ in range(FLOOD)]
    t0 = time.time()
    th = threading.Thread(target=client_loop, args=(t0,))
    th.start()
    while th.is_alive():
        await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    failed = 0
    for lo in range(0, SECONDS, 5):
        win = [r for r in results if lo <= r[0] < lo + 5]
        ok = sum(1 for r in win if r[1] == 0)
        if lo >= 15:
            failed += len(win) - ok
        errs = sorted({r[2] for r in win if r[1] != 0})
        print(f"{lo:2d}-{lo + 5:2d}s: {ok}/{len(win)} served {errs[:2]}")
    print(f"stranger connections opened {counts['opened']}, closed by the node {counts['closed']}")
    print(f"node {node + 1} RSS base {base} MiB, peak {peak[0]} MiB, growth {peak[0] - base} MiB")
    print("every call from 15 s on served" if not failed else f"{failed} calls failed from 15 s on")
    return failed


def main():
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    bin_dir, peer = sys.argv[1], "--peer" in sys.argv[2:]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cluster = Cluster(bin_dir, 3 if peer else 1, peer)
    node = 1 if peer else 0
    port = cluster.peer[node] if peer else cluster.client[node]
    try:
        deadline = time.time() + 60
        while cluster.call(node)[0] != 0:
            if time.time() > deadline:
                print("the node never served:", cluster.log_tail(node), file=sys.stderr)
                sys.exit(1)
            time.sleep(0.5)
        what = "peer" if peer else "client"
        print(f"node {node + 1} serves; flooding its {what} port {port} for {SECONDS} s")
        failed = asyncio.run(flood(cluster, node, port))
    finally:
        cluster.stop()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
