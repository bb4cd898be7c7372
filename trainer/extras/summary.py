"""`ModelSummary`: the model's layers printed when training starts (Lightning's ModelSummary), a callback that
`summary=True` (`--summary`) adds through trainer/layers.CONFIG_CALLBACKS.

Each top-level layer's name, type, parameters and, when a forward of one training sample works, its output shape;
then the totals. The forward runs in eval mode without gradients and with the RNG state restored, so the run
trains as it would without it.
"""

from __future__ import annotations

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
        for line in model_summary(trainer.raw_model, first_input(trainer.task.train_set, trainer.device)):
            trainer.log(f"[plainloop] {line}")


def first_input(dataset: Dataset, device: torch.device) -> torch.Tensor | None:
    """The first sample's input as a batch of one on `device`, when the dataset can be indexed."""
    try:
        sample = dataset[0]
    except Exception:  # an iterable or lazily opened dataset: a summary without shapes
        return None
    x = sample[0] if isinstance(sample, list | tuple) and sample else None
    return x.unsqueeze(0).to(device) if isinstance(x, torch.Tensor) else None


def model_summary(model: nn.Module, sample: torch.Tensor | None = None) -> list[str]:
    """The summary as text lines (see the module docstring); `sample`: one batch of inputs on the model's device."""
    layers = list(model.named_children()) or [(type(model).__name__, model)]
    shapes: dict[str, str] = {}
    failed = ""
    if sample is not None:
        handles = [m.register_forward_hook(_shape_hook(shapes, name)) for name, m in layers]
        was_training = model.training
        devices = [sample.device] if sample.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                model.eval()
                model(sample)
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
