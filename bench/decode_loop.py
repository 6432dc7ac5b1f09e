"""An inference decode loop shaped like vLLM v1's, for recording on a GPU node.

Each step replays a captured CUDA graph (``torch.cuda.CUDAGraph``, no inductor compile),
copies the sampled tokens to pinned host memory without blocking, records an event on the
stream and waits on that event, not on the stream. Writes ``time steps`` once a second to
``--log``. ``--slow FILE``: a fraction f > 0 in it makes each step sleep f times the recent
step time (sleep's own floor makes short steps slower than f says). Needs PyTorch and a GPU;
tests/fixtures/h200/decode.db was recorded on it.

    python3 bench/decode_loop.py --seconds 60 --log /tmp/decode.log --slow /tmp/slow
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--log", required=True)
    parser.add_argument("--slow", default="")
    args = parser.parse_args()
    torch.manual_seed(0)
    layers = [m for _ in range(6) for m in (nn.Linear(1024, 1024), nn.GELU())]
    model = nn.Sequential(*layers).cuda().eval()
    static_x = torch.randn(32, 1024, device="cuda")
    side = torch.cuda.Stream()  # warm-up off the capture stream, as PyTorch asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_y = model(static_x).argmax(dim=-1)
    host = torch.empty(static_y.shape, dtype=static_y.dtype, pin_memory=True)
    done = torch.cuda.Event()
    out = open(args.log, "w", buffering=1)  # noqa: SIM115 (open for the whole run)
    end = time.time() + args.seconds
    steps, last, step_s, slow, checked = 0, time.time(), 0.0, 0.0, 0.0
    while time.time() < end:
        t0 = time.perf_counter()
        graph.replay()
        host.copy_(static_y, non_blocking=True)
        done.record()
        done.synchronize()
        steps += 1
        now = time.time()
        if args.slow and now - checked > 0.5:
            checked = now
            try:
                with open(args.slow) as f:
                    slow = float(f.read().strip() or 0)
            except (OSError, ValueError):
                slow = 0.0
        if slow > 0:
            time.sleep(slow * step_s)
        dt = time.perf_counter() - t0
        step_s = 0.9 * step_s + 0.1 * dt if step_s else dt
        if now - last >= 1.0:
            out.write(f"{now:.3f} {steps}\n")
            last = now


if __name__ == "__main__":
    main()
