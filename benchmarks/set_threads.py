"""`torch.set_num_threads` against the engine's `set_threads`, on the decode attention kernel at SmolLM2's shapes.

    .venv/bin/python benchmarks/set_threads.py [--threads 2]

Each way of setting the thread count runs in a fresh process (the setting is process-wide once made): nothing
set (torch's default), `torch.set_num_threads(N)`, and `agentgrad.engine.threads.set_threads(N)`, which sets only
OpenMP's count. Each times `scaled_dot_product_attention` as a decode step calls it (9 query heads over 3
key/value heads of 64, one query token a row, bf16, a padding mask, 30 layers' caches so none stays in the
processor's cache), at 8 rows over 110 cached tokens and 64 rows over 170; best of 7, wall, ms a layer.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CHILD = """
import sys, time, torch
import torch.nn.functional as F
way, threads = sys.argv[1], int(sys.argv[2])
if way == "torch.set_num_threads":
    torch.set_num_threads(threads)
elif way == "set_threads":
    from agentgrad.engine.threads import set_threads
    set_threads(threads)
cells = []
for rows, length in ((8, 110), (64, 170)):
    layers = []
    for _ in range(30):
        keys, values = (torch.randn(rows, 3, length + 64, 64, dtype=torch.bfloat16)[:, :, :length] for _ in range(2))
        mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
        mask[::2, :, :, :20] = False
        layers.append((torch.randn(rows, 9, 1, 64, dtype=torch.bfloat16), keys, values, mask))
    best = float("inf")
    for _ in range(7):
        began = time.perf_counter()
        for query, keys, values, mask in layers:
            F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=0.125, enable_gqa=True)
        best = min(best, time.perf_counter() - began)
    cells.append(f"{best / len(layers) * 1e3:.3f}")
print(torch.get_num_threads(), *cells)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print(f"decode attention, ms a layer (wall, best of 7); load average {os.getloadavg()[0]:.2f}")
    print("| threads set by | threads | 8 rows × 110 tokens | 64 rows × 170 tokens |")
    print("|---|---|---|---|")
    for way in ("nothing (torch's default)", "torch.set_num_threads", "set_threads"):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, way, str(args.threads)], capture_output=True, text=True, check=True
        ).stdout.split()
        print(f"| {way} | {out[0]} | {out[1]} | {out[2]} |")


if __name__ == "__main__":
    main()
