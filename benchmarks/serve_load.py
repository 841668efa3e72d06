"""Load on `tformer serve`: N concurrent clients for a fixed time, per N.

Each client is a thread sending `POST /v1/translate` requests back to back (one input each,
drawn from a fixed list of sources), over its own keep-alive HTTP connection. For each number
of clients (default 1, 8, 32, 128) the script prints one JSON line: requests/s, new tokens/s
(the outputs' tokens), p50 / p95 / p99 latency in ms, and errors; then a Markdown table.

Point it at a running server with --url, or give --checkpoint to start `tformer serve` on a
free port for the run (its own flags after --serve-args, e.g. "--batch-window-ms 5").

Usage: python benchmarks/serve_load.py (--url http://127.0.0.1:8000 | --checkpoint RUN)
       [--clients 1,8,32,128] [--seconds 10] [--max-new-tokens 32] [--serve-args "..."]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    "6 March 2025", "the first of May 1999", "03/06/25", "June 7th, 2001", "12.10.2019",
    "4 Jul 1976", "2020-02-29", "31 December 1999", "3 1 4 1 5", "2 7 1 8",
]


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def client_loop(host: str, port: int, until: float, n: int, body: dict, tally: Tally) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=120)
    i = n
    while time.monotonic() < until:
        data = json.dumps({**body, "inputs": SOURCES[i % len(SOURCES)]}).encode()
        i += 1
        start = time.monotonic()
        try:
            conn.request("POST", "/v1/translate", body=data,
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            text = response.read()
            ok = response.status == 200
        except OSError:
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=120)
            ok, text = False, b""
        elapsed = time.monotonic() - start
        with tally.lock:
            if ok:
                tally.latencies.append(elapsed)
                outputs = json.loads(text)["results"][0]["outputs"]
                tally.tokens += sum(o["length"] for o in outputs)
            else:
                tally.errors += 1
    conn.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def measure(host: str, port: int, clients: int, seconds: float, body: dict) -> dict:
    tally = Tally()
    until = time.monotonic() + seconds
    start = time.monotonic()
    threads = [threading.Thread(target=client_loop, args=(host, port, until, n, body, tally))
               for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - start  # includes the requests in flight at the deadline
    ms = [x * 1000 for x in tally.latencies]
    return {
        "clients": clients,
        "seconds": round(wall, 2),
        "requests": len(ms),
        "requests_per_s": round(len(ms) / wall, 2),
        "new_tokens_per_s": round(tally.tokens / wall, 1),
        "p50_ms": round(percentile(ms, 50), 1),
        "p95_ms": round(percentile(ms, 95), 1),
        "p99_ms": round(percentile(ms, 99), 1),
        "mean_ms": round(statistics.fmean(ms), 1) if ms else float("nan"),
        "errors": tally.errors,
    }


def start_server(checkpoint: str, extra: str) -> tuple[subprocess.Popen, int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tformer", "serve", checkpoint, "--port", str(port),
               *shlex.split(extra)]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.2)
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"tformer serve {checkpoint} did not start")


def table(records: list[dict]) -> str:
    lines = [
        "| clients | requests/s | new tokens/s | p50 ms | p95 ms | p99 ms | errors |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        lines.append(
            f"| {r['clients']} | {r['requests_per_s']} | {r['new_tokens_per_s']} | "
            f"{r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['errors']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="A running server, e.g. http://127.0.0.1:8000")
    where.add_argument("--checkpoint", help="Start `tformer serve CHECKPOINT` for the run.")
    parser.add_argument("--serve-args", default="", help="Flags for the started server.")
    parser.add_argument("--clients", default="1,8,32,128")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    proc = None
    if args.url:
        parts = urlsplit(args.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
    else:
        proc, port = start_server(args.checkpoint, args.serve_args)
        host = "127.0.0.1"
    body = {"max_new_tokens": args.max_new_tokens}
    records = []
    try:
        for clients in [int(c) for c in args.clients.split(",")]:
            record = measure(host, port, clients, args.seconds, body)
            records.append(record)
            print(json.dumps(record), flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    print()
    print(table(records))


if __name__ == "__main__":
    main()
