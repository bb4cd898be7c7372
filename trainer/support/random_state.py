"""The random generators a run draws from (Python's, NumPy's, torch's, CUDA's): seeded, saved, restored."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, object]:
    """Every RNG the loop touches, as tensors/plain types so torch.load(weights_only=True) accepts it."""
    np_state = np.random.get_state(legacy=False)  # the global MT19937's key and position, as a dict
    state: dict[str, object] = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_to_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_tuple(x: Sequence[object]) -> tuple[object, ...]:
    # python's random state round-trips through a checkpoint as lists; setstate wants tuples
    return tuple(_to_tuple(v) if isinstance(v, list | tuple) else v for v in x)


class RngState:
    """Python's, NumPy's and torch's generators."""

    def state_dict(self) -> dict[str, Any]:
        return rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(state)
