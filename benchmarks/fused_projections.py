"""Would fusing the projections of the bf16 sampling copy pay? One packed linear for q, k and v (and one for gate
and up) against three (two) per layer, as `engine/prepack.py` packs them, at a decode step's row counts.

    .venv/bin/python benchmarks/fused_projections.py

Random bf16 weights of each model's shapes (SmolLM2-135M: 30 layers, hidden 576, k/v 192, MLP 1536; Qwen2.5-0.5B:
24 layers, hidden 896, k/v 128, MLP 4864), packed for oneDNN; the time of a step's q/k/v and gate/up products
over all layers, 1 thread, best of 5 in CPU seconds (the machine may be shared), and whether the fused product
equals the three separate ones bit for bit.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch

from agentgrad.engine.prepack import PACK_ROWS

SHAPES = {  # name: (layers, hidden, q out, k/v out, MLP width)
    "smollm2-135m": (30, 576, 576, 192, 1536),
    "qwen2.5-coder-0.5b": (24, 896, 896, 128, 4864),
}


def packed(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def cpu_seconds(run: Callable[[], None]) -> float:
    run()
    best = float("inf")
    for _ in range(5):
        began = time.process_time()
        run()
        best = min(best, time.process_time() - began)
    return best


def products(weights: list[list[torch.Tensor]], x: torch.Tensor) -> None:
    """A decode step's products with these packed weights, layer after layer."""
    for layer in weights:
        for weight in layer:
            linear(x, weight)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for name, (layers, hidden, q, kv, mlp) in SHAPES.items():
        weights = [
            [torch.randn(out, hidden, dtype=torch.bfloat16) for out in (q, kv, kv, mlp, mlp)] for _ in range(layers)
        ]
        separate = [[packed(w) for w in layer] for layer in weights]
        fused = [[packed(torch.cat(layer[:3])), packed(torch.cat(layer[3:]))] for layer in weights]
        for rows in (1, 8, 32, 64):
            x = torch.randn(rows, hidden, dtype=torch.bfloat16)

            apart = cpu_seconds(functools.partial(products, separate, x))
            together = cpu_seconds(functools.partial(products, fused, x))
            same = torch.equal(torch.cat([linear(x, w) for w in separate[0][:3]], -1), linear(x, fused[0][0]))
            print(
                f"{name}, {rows:2} rows: separate {apart * 1e3:.1f} ms, fused {together * 1e3:.1f} ms "
                f"({1 - together / apart:.0%} less), identical: {same}",
                flush=True,
            )


if __name__ == "__main__":
    main()
