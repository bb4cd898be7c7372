"""Model sizes of the benchmark configurations, in a module without torch: benchmarks/scaling.py measures the
memory of processes that must not have imported it."""

from __future__ import annotations

from typing import Any

# RecursiveAttentionTransformer keyword arguments
TINY_MODEL: dict[str, Any] = {
    "d_model": 32,
    "num_heads": 2,
    "num_layers": 1,
    "dim_feedforward": 64,
    "recursion_depth": 1,
    "dropout": 0.0,
}
CPU_MODEL: dict[str, Any] = {
    "d_model": 128,
    "num_heads": 4,
    "num_layers": 2,
    "dim_feedforward": 256,
    "recursion_depth": 2,
    "dropout": 0.0,
}
