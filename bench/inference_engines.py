"""Cost fleet-push pays per push interval for the node's inference servers.

Times, in microseconds per call: parsing one vLLM-shaped /metrics text (the captured fixture
grown with LoRA-adapter and per-engine series to ``--series`` samples, as a busy server has),
recognising one command line, scanning a fixture proc tree of ``--procs`` processes (one of
them a vLLM server), and the watcher's whole ``observe`` (scan, fetch from a loopback HTTP
server, parse, rates, the node DB row). Prints median and p95.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.node_sample import timed
from ingero.collectors import engines as ce
from ingero.nodedb import schema
from ingero.push.engines import EngineWatcher
from ingero.runtime.clock import SystemClock

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "engines" / "vllm.txt"
ARGV = [
    "/opt/venv/bin/python3",
    "/opt/venv/bin/vllm",
    "serve",
    "meta-llama/Llama-3.1-8B-Instruct",
    "--served-model-name",
    "llama",
    "--tensor-parallel-size",
    "8",
    "--kv-transfer-config",
    '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}',
]


def metrics_text(series: int) -> str:
    """The fixture plus gauge series of other adapters until ``series`` samples."""
    base = FIXTURE.read_text()
    have = sum(1 for line in base.splitlines() if line and not line.startswith("#"))
    extra = [
        f'vllm:lora_requests_info{{max_lora="64",running_lora_adapters="a{i}"}} {i}.0'
        for i in range(max(0, series - have))
    ]
    return base + "# TYPE vllm:lora_requests_info gauge\n" + "\n".join(extra) + "\n"


def proc_tree(root: Path, procs: int, port: int) -> None:
    for pid in range(100, 100 + procs):
        (root / str(pid)).mkdir(parents=True)
        argv = [*ARGV, "--port", str(port)] if pid == 100 else ["/usr/bin/bash", "-l"]
        (root / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--series", type=int, default=500, help="samples in the /metrics text")
    parser.add_argument("--procs", type=int, default=500, help="processes in the proc tree")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    text = metrics_text(args.series)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *a: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        root, db = Path(tmp) / "proc", Path(tmp) / "node.db"
        proc_tree(root, args.procs, server.server_address[1])
        schema.connect(db).conn.close()
        watcher = EngineWatcher(db_path=db, clock=SystemClock(), proc_root=root)
        rows = [
            (
                f"parse /metrics ({args.series} samples, {len(text)} B)",
                lambda: ce.parse(text, "vllm"),
            ),
            ("recognise one command line", lambda: ce.recognise(ARGV)),
            (f"scan {args.procs} processes, first time", lambda: ce.scan(root)),
            (f"scan {args.procs} processes, again", ce.Scanner(root).scan),
            ("observe (scan + fetch + parse + row)", watcher.observe),
        ]
        print(f"{'step':<48} {'median µs':>10} {'p95 µs':>10}")
        for name, fn in rows:
            median, p95 = timed(fn, args.repeat)
            print(f"{name:<48} {median:>10.1f} {p95:>10.1f}")
    server.shutdown()


if __name__ == "__main__":
    main()
