"""`ModelSummary`: the model's layers printed when training starts (Lightning's ModelSummary), a callback that
`summary=True` (`--summary`) adds through trainer/layers.CONFIG_CALLBACKS.

Each top-level layer's name, type, parameters and, when a forward of one training sample works, its output shape;
then the totals. The forward runs in eval mode without gradients and with the RNG state restored, so the run
trains as it would without it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import Dataset

from ..config import TrainConfig
from ..hooks import Callback, TrainerView
from ..knobs import human_count, parameter_count


class ModelSummary(Callback):
    """Prints the summary on rank 0 at on_train_start (after the run's notes and its one-line description)."""

    @classmethod
    def for_config(cls, cfg: TrainConfig, given: list[object]) -> tuple[ModelSummary, None] | None:
        """The callback `cfg.summary` asks for, unless one is given already (trainer/layers.py)."""
        if not cfg.summary or any(isinstance(cb, ModelSummary) for cb in given):
            return None
        return cls(), None

    def on_train_start(self, trainer: TrainerView) -> None:
        model = trainer.raw_model
        inputs = first_inputs(trainer.task.train_set, trainer.device, _required_args(model))
        for line in model_summary(model, inputs):
            trainer.log(f"[plainloop] {line}")


def _required_args(model: nn.Module) -> int:
    """How many positional arguments the model's forward requires (2 for nanoGPT's forward(idx, targets))."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return max(1, sum(p.kind in kinds and p.default is inspect.Parameter.empty for p in params))


def first_inputs(dataset: Dataset, device: torch.device, n: int = 1) -> tuple[torch.Tensor, ...] | None:
    """The first sample's first `n` tensors (its input, and its target when the forward takes one) as batches of
    one on `device`, when the dataset can be indexed."""
    try:
        sample = dataset[0]
    except Exception:  # an iterable or lazily opened dataset: a summary without shapes
        return None
    parts = tuple(sample[:n]) if isinstance(sample, list | tuple) else ()
    if len(parts) < n or not all(isinstance(t, torch.Tensor) for t in parts):
        return None
    return tuple(t.unsqueeze(0).to(device) for t in parts)


def model_summary(model: nn.Module, sample: tuple[torch.Tensor, ...] | None = None) -> list[str]:
    """The summary as text lines (see the module docstring); `sample`: the forward's arguments, one batch of one on
    the model's device."""
    layers = list(model.named_children()) or [(type(model).__name__, model)]
    shapes: dict[str, str] = {}
    failed = ""
    if sample is not None:
        handles = [m.register_forward_hook(_shape_hook(shapes, name)) for name, m in layers]
        was_training = model.training
        devices = [sample[0].device] if sample[0].device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                model.eval()
                model(*sample)
        except Exception as e:  # a model that needs more than its input: the summary goes without shapes
            failed = f"output shapes: a forward of one training sample failed ({type(e).__name__}: {e})"[:200]
        finally:
            model.train(was_training)
            for h in handles:
                h.remove()
    rows: list[tuple[str, ...]] = [("", "Name", "Type", "Params", "Out shape")]
    for i, (name, m) in enumerate(layers):
        n = sum(p.numel() for p in m.parameters())
        rows.append(
            (str(i), name, type(m).__name__, human_count(n), shapes.get(name, "?" if sample is not None else ""))
        )
    if sample is None or all(not r[4] or r[4] == "?" for r in rows[1:]):
        rows = [r[:4] for r in rows]  # no shapes known: no empty column
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [" | ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    counts = parameter_count(model)
    lines.append(
        f"{human_count(counts['trainable'])} trainable, {human_count(counts['total'] - counts['trainable'])} "
        f"non-trainable parameters; {counts['size_mb']:.1f} MB of parameters and buffers"
    )
    return lines + ([failed] if failed else [])


def _shape_hook(shapes: dict[str, str], name: str) -> Callable[[nn.Module, object, object], None]:
    def hook(module: nn.Module, inputs: object, output: object) -> None:
        out = output[0] if isinstance(output, tuple | list) and output else output
        shapes[name] = str(list(out.shape)) if isinstance(out, torch.Tensor) else type(output).__name__

    return hook
