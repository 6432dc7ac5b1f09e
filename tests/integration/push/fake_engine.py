"""A stand-in vLLM server: started as a console script named ``vllm`` (``python …/vllm serve
MODEL --port N …``, the command line a real ``vllm serve`` has), it serves vLLM-shaped
Prometheus text at ``/metrics`` over loopback: cumulative inter-token latency histograms,
token counters and request gauges that advance with wall time, as a replica under a steady
load does.

The control file (``$FAKE_ENGINE_CONTROL``) sets how it answers, read at each request: a
number is the slowdown (per-token latency times 1 + it), ``garbage`` answers text that is not
Prometheus text, ``huge`` answers more than any bound, ``hang`` never answers.

Standard library only: it runs as its own process, outside the package.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BASE_LATENCY_S = 0.015  # per output token, a healthy replica
TOKENS_PER_S = 400.0  # the load every replica gets (a router spreads it evenly)
BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16)


class State:
    def __init__(self, model: str, control: str | None) -> None:
        self.model = model
        self.control = control
        self.lock = threading.Lock()
        self.tokens = 0.0
        self.latency_sum = 0.0
        self.buckets = [0.0] * (len(BUCKETS) + 1)
        self.last = time.monotonic()

    def mode(self) -> str:
        if not self.control:
            return "0"
        try:
            with open(self.control) as f:
                return f.read().strip() or "0"
        except OSError:
            return "0"

    def advance(self, slowdown: float) -> None:
        latency = BASE_LATENCY_S * (1.0 + slowdown)
        with self.lock:
            now = time.monotonic()
            tokens = TOKENS_PER_S * (now - self.last)
            self.last = now
            self.tokens += tokens
            self.latency_sum += tokens * latency
            index = next((i for i, b in enumerate(BUCKETS) if latency <= b), len(BUCKETS))
            self.buckets[index] += tokens

    def text(self) -> str:
        labels = f'engine="0",model_name="{self.model}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} 8.0",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{labels}}} {self.tokens:.1f}",
            "# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.",
            "# TYPE vllm:inter_token_latency_seconds histogram",
        ]
        cumulative = 0.0
        for bound, count in zip((*BUCKETS, float("inf")), self.buckets, strict=True):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(
                f'vllm:inter_token_latency_seconds_bucket{{engine="0",le="{le}",'
                f'model_name="{self.model}"}} {cumulative:.1f}'
            )
        lines.append(f"vllm:inter_token_latency_seconds_count{{{labels}}} {self.tokens:.1f}")
        lines.append(f"vllm:inter_token_latency_seconds_sum{{{labels}}} {self.latency_sum:.6f}")
        return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="vllm")
    parser.add_argument("command")
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+")
    args, _unknown = parser.parse_known_args()  # every other vLLM flag is taken, unread
    state = State(
        (args.served_model_name or [args.model])[0], os.environ.get("FAKE_ENGINE_CONTROL")
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            mode = state.mode()
            if mode == "hang":
                time.sleep(3600)
                return
            if mode == "garbage":
                body = b"<html>\x00\xff not metrics {{{ 1 2 3\n" * 50
            elif mode == "huge":
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                line = b'vllm:num_requests_running{model_name="x"} 1.0\n' * 1000
                try:
                    for _ in range(100_000):  # ~4.7 GB unless the reader stops first
                        self.wfile.write(line)
                except OSError:
                    pass
                return
            else:
                state.advance(float(mode))
                body = state.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
