"""Small model knobs decided once at start-up: channels_last, deterministic mode, SyncBatchNorm, parameter count
(the layer-by-layer summary, `summary=True`, is the callback in trainer/extras/summary.py).

Each returns the line(s) the start-up report prints, so no knob acts silently.
"""

from __future__ import annotations

import os
import random
from typing import Any, TypedDict

import numpy as np
import torch
from torch import nn

from .signals import ignore_stop_signals


class ParameterCount(TypedDict):
    total: int  # parameters, a tied weight counted once
    trainable: int
    size_mb: float  # parameters and buffers


def channels_last(model: nn.Module, device: torch.device) -> str:
    """Put the model's 4-D weights in channels_last (NHWC) memory format; batches follow in `to_channels_last`."""
    has_4d = any(p.dim() == 4 for p in model.parameters())
    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # a real overload, missing in the stubs
    if not has_4d:
        return (
            "channels_last: the model has no 4-D (convolution) weights, so only its 4-D inputs change layout; "
            "it helps convolutions on tensor-core GPUs"
        )
    where = "on CUDA, cuDNN's NHWC convolution kernels" if device.type == "cuda" else f"on {device.type}"
    return f"channels_last: 4-D weights and 4-D batch tensors in NHWC layout ({where})"


def to_channels_last(batch: object) -> object:
    """4-D tensors of a (nested) batch in channels_last; a device-side copy, no host sync."""
    if isinstance(batch, torch.Tensor):
        return batch.contiguous(memory_format=torch.channels_last) if batch.dim() == 4 else batch
    if isinstance(batch, dict):
        return {k: to_channels_last(v) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        moved: list[Any] = [to_channels_last(v) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)  # a namedtuple: by field
    return batch


def deterministic(seed: int, device: torch.device) -> list[str]:
    """torch.use_deterministic_algorithms(True) and what CUDA needs for it (cuBLAS workspace, no cudnn autotuner);
    loader workers are seeded by `seed_worker`. An op without a deterministic kernel then raises at its first use,
    naming the op, rather than training differently from run to run."""
    notes = []
    if device.type == "cuda" and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):
        # must be set before the first cuBLAS call; this runs before the model is used
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        notes.append("deterministic: CUBLAS_WORKSPACE_CONFIG=:4096:8 (cuBLAS needs it for repeatable results)")
    torch.use_deterministic_algorithms(True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = False  # the autotuner may pick different kernels per run
        torch.backends.cudnn.deterministic = True
    notes.append(
        f"deterministic: torch.use_deterministic_algorithms(True), loader workers seeded from seed {seed}"
        + (", cudnn.benchmark off" if device.type == "cuda" else "")
    )
    return notes


def seed_worker(worker_id: int) -> None:
    """DataLoader worker_init_fn: numpy and random seeded from the worker's torch seed (torch seeds itself from the
    loader's generator), so augmentations in workers repeat exactly."""
    s = torch.initial_seed() % 2**32
    np.random.seed(s)
    random.seed(s)


def deterministic_worker(worker_id: int) -> None:
    """worker_init_fn under deterministic: stop signals left to the training process, and `seed_worker`."""
    ignore_stop_signals(worker_id)
    seed_worker(worker_id)


def sync_batchnorm(model: nn.Module, world_size: int, device: torch.device) -> tuple[nn.Module, str]:
    """DDP: BatchNorm layers to SyncBatchNorm (statistics over the global batch). It synchronises CUDA tensors only,
    so on a CPU, as with one process, the layers are kept and the note says why."""
    n = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if n == 0:
        return model, "sync_batchnorm: the model has no BatchNorm layers; nothing to convert"
    if world_size <= 1:
        return model, "sync_batchnorm: one process, nothing to synchronise; BatchNorm layers kept"
    if device.type != "cuda":
        return model, f"sync_batchnorm: SyncBatchNorm synchronises CUDA tensors only; BatchNorm layers kept on {device}"
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model, f"sync_batchnorm: {n} BatchNorm layer(s) -> SyncBatchNorm over {world_size} processes"


def parameter_count(model: nn.Module) -> ParameterCount:
    """Parameters (total, trainable; a tied weight counted once) and the size of parameters + buffers in MB."""
    params = {id(p): p for p in model.parameters()}.values()
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    size = sum(p.numel() * p.element_size() for p in params)
    size += sum(b.numel() * b.element_size() for b in {id(b): b for b in model.buffers()}.values())
    return {"total": total, "trainable": trainable, "size_mb": size / 2**20}


def describe_parameters(counts: ParameterCount) -> str:
    """'1.23M parameters (1.23M trainable), 4.7 MB' for the start-up line."""
    return f"{human_count(counts['total'])} parameters ({human_count(counts['trainable'])} trainable), {counts['size_mb']:.1f} MB"


def human_count(n: int) -> str:
    """1234567 -> '1.23M'."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)
