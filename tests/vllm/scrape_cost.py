"""What answering the picker's scrapes costs an idle real vLLM: CPU of the server's whole
process tree over a window with no scrapes, then with one GET /metrics every 1000, 200, 100
and 50 ms (the picker's scrape, one at a time as the scraping VM sends them).

    scrape_cost.py VENV_PYTHON MODEL_DIR [SECONDS]

Prints one line per interval: cores used (CPU seconds per second) and the extra over idle.
Starts one server on 127.0.0.1 (OpenMP on core 0) and stops it, by pid, however it ends.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree(root):
    """The pids of `root` and all its descendants."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                parents[int(entry)] = int(fields[1])
            except OSError:
                pass
    pids, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in pids:
                pids.add(pid)
                frontier.append(pid)
    return pids


def cpu_seconds(root):
    total = 0
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            pass
    return total / TICKS


def window(root, url, interval, seconds):
    start_cpu, start = cpu_seconds(root), time.monotonic()
    scrapes = 0
    while time.monotonic() - start < seconds:
        if interval is None:
            time.sleep(0.5)
            continue
        began = time.monotonic()
        with urllib.request.urlopen(url, timeout=5) as response:
            response.read()
        scrapes += 1
        time.sleep(max(0.0, interval - (time.monotonic() - began)))
    elapsed = time.monotonic() - start
    return (cpu_seconds(root) - start_cpu) / elapsed, scrapes


def main():
    python, model_dir = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
    port = free_port()
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0", VLLM_CPU_KVCACHE_SPACE="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    log = open(os.path.join(model_dir, "..", "scrape-cost-vllm.log"), "w")
    server = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
         "--port", str(port), "--model", os.path.join(model_dir, "tiny-llama"),
         "--served-model-name", "tiny-llama", "--max-model-len", "2048",
         "--max-num-seqs", "4", "--enforce-eager", "--gpu-memory-utilization", "0.2",
         "--num-gpu-blocks-override", "48"],
        env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit("vLLM did not become healthy; see scrape-cost-vllm.log")
                time.sleep(1)
        time.sleep(5)  # let start-up work settle
        idle, _ = window(server.pid, None, None, seconds)
        print(f"no scrapes:        {idle:.3f} cores")
        for interval_ms in (1000, 200, 100, 50):
            cores, scrapes = window(server.pid, base + "/metrics", interval_ms / 1000, seconds)
            print(f"every {interval_ms:>4} ms:     {cores:.3f} cores "
                  f"(+{cores - idle:.3f} over idle; {scrapes} scrapes in {seconds:.0f} s)")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


if __name__ == "__main__":
    main()
