#!/usr/bin/env python3
"""A stranger's flood against one node: 10 050 idle TCP connections from 127.0.0.2 to one node's client port,
re-opened as fast as the node closes them, for 40 s, while a client with a token on 127.0.0.1
runs `conch sema` every 0.5 s. Reports served/failed calls per 5 s and the node's RSS.

    scripts/front-door-flood.py target/debug      # or target/release: where conchd and conch are
"""
import asyncio, os, subprocess, sys, tempfile, time, socket, resource
_h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; resource.setrlimit(resource.RLIMIT_NOFILE, (_h, _h))
bin_dir = sys.argv[1]
d = tempfile.mkdtemp()
tok = "x" * 16 + os.urandom(16).hex()
for name, val in [("token", tok), ("secret", os.urandom(24).hex())]:
    p = os.path.join(d, name); open(p, "w").write(val); os.chmod(p, 0o600)
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
node = subprocess.Popen([f"{bin_dir}/conchd", "--id", "1", "--data-dir", f"{d}/data",
    "--listen", f"127.0.0.1:{port}", "--bootstrap-admin-token-file", f"{d}/token",
    "--peer-secret-file", f"{d}/secret"], stderr=open(f"{d}/log", "w"))
def rss():
    for l in open(f"/proc/{node.pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) // 1024
env = dict(os.environ, CONCH_ENDPOINTS=f"127.0.0.1:{port}", CONCH_TOKEN=tok)
def call():
    r = subprocess.run([f"{bin_dir}/conch", "--timeout", "3s", "sema", "flood-check", "--max", "1", "--", "true"],
                       env=env, capture_output=True, text=True)
    return r.returncode, r.stderr.strip()[:160]
deadline = time.time() + 60
while call()[0] != 0:
    if time.time() > deadline: print("node never served", open(f"{d}/log").read()[-2000:]); node.kill(); sys.exit(1)
    time.sleep(0.5)
base = rss(); print(f"node up, RSS {base} MiB")
stop = False; opened = 0; closed = 0
async def holder():
    global opened, closed
    while not stop:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        except OSError:
            await asyncio.sleep(0.05); continue
        opened += 1
        try:
            while not stop:
                try:
                    data = await asyncio.wait_for(r.read(64), 1)
                    if not data: break
                except asyncio.TimeoutError:
                    continue
        except OSError:
            pass
        closed += 1
        w.close()
import threading
results = []; peak = [base]
def client_loop(t0):
    while time.time() - t0 < 40:
        rc, err = call()
        results.append((time.time() - t0, rc, err)); peak[0] = max(peak[0], rss())
        time.sleep(0.5)
async def main():
    global stop
    tasks = [asyncio.create_task(holder()) for _ in range(10050)]
    t0 = time.time()
    th = threading.Thread(target=client_loop, args=(t0,)); th.start()
    while th.is_alive():
        await asyncio.sleep(0.5)
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    for lo in range(0, 40, 5):
        win = [r for r in results if lo <= r[0] < lo + 5]
        ok = sum(1 for r in win if r[1] == 0)
        errs = {r[2] for r in win if r[1] != 0}
        print(f"{lo:2d}-{lo+5:2d}s: {ok}/{len(win)} served {list(errs)[:2]}")
    print(f"stranger connections opened {opened}, closed by the node {closed}")
    print(f"RSS base {base} MiB, peak {peak[0]} MiB, growth {peak[0] - base} MiB")
asyncio.run(main())
node.terminate(); node.wait(30)
