"""Model sizes (RecursiveAttentionTransformer keyword arguments) in a module without torch: benchmarks/scaling.py
measures the memory of processes that must not have imported it."""

from typing import Any

_KEYS = ("d_model", "num_heads", "num_layers", "dim_feedforward", "recursion_depth", "dropout")
TINY_MODEL: dict[str, Any] = dict(zip(_KEYS, (32, 2, 1, 64, 1, 0.0)))
CPU_MODEL: dict[str, Any] = dict(zip(_KEYS, (128, 4, 2, 256, 2, 0.0)))
