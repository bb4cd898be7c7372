"""PyTorch Lightning configured as seed 000's BaseTrainer: the peer plainloop is measured against.

Seed 000's defaults: precision "16-mixed", num_workers=8, pin_memory=True, persistent_workers=True,
prefetch_factor=2, batch 150, AdamW, validation every epoch (Lightning's default), Lightning's progress
bar and checkpointing left on. It reads plainloop's cached dataset (memory-mapped .npy, batched reads):
its best case, so the ratio measures the loop, not our cache. Lightning is a benchmark-only dependency.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

SEED_LOADER = {"num_workers": 8, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 2}


def lightning_available() -> str | None:
    """Lightning's version, or None when it is not installed (the harness then skips this row and says so)."""
    try:
        import lightning

        return str(lightning.__version__)
    except ImportError:
        return None


def run_lightning(
    model: torch.nn.Module,
    train_set: Dataset,
    val_set: Dataset | None,
    device: torch.device,
    epochs: int = 1,
    warmup_epochs: int = 1,
    batch_size: int = 150,
    lr: float = 1e-3,
    precision: str = "16-mixed",
    loader: dict[str, Any] | None = None,
    monitor: Any = None,
    seed: int = 0,
    root_dir: str | None = None,
) -> dict[str, Any]:
    """Fit for warmup_epochs + epochs; time the last `epochs` (training + validation + checkpointing)."""
    import lightning as L

    loader = dict(SEED_LOADER if loader is None else loader)
    if loader.get("num_workers", 0) == 0:
        loader.pop("persistent_workers", None)
        loader.pop("prefetch_factor", None)

    class SeedModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = self.model.loss(self.model(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", self.model.loss(self.model(x), y), prog_bar=True)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)

    marks: dict[str, Any] = {"epoch_end": [], "samples": [], "data_s": [], "step_s": []}

    class Clock(L.Callback):
        """Host-side step timing, the same definition as plainloop's monitor: data wait = time from the end
        of the previous step (or the epoch start) until the batch reaches training_step."""

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.t_prev = time.perf_counter()
            self.t_start = None
            if trainer.current_epoch == warmup_epochs and monitor is not None:
                monitor.start_monitoring()
            marks["samples"].append(0)
            marks["data_s"].append(0.0)
            marks["step_s"].append(0.0)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.t_start = time.perf_counter()

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            t = time.perf_counter()
            data, step, n = self.t_start - self.t_prev, t - self.t_prev, int(batch[0].shape[0])
            marks["samples"][-1] += n
            marks["data_s"][-1] += data
            marks["step_s"][-1] += step
            if monitor is not None and trainer.current_epoch >= warmup_epochs:
                monitor.log_iteration(step, data, n)
            self.t_prev = t

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # note: sync point (epoch timing boundary)
            marks["epoch_end"].append(time.perf_counter())

    torch.manual_seed(seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, **loader)
    val_loader = (
        DataLoader(val_set, batch_size=batch_size, shuffle=False, **loader) if val_set is not None else None
    )
    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(
            accelerator="gpu" if device.type == "cuda" else "cpu",
            devices=1,
            precision=precision,
            max_epochs=warmup_epochs + epochs,
            logger=False,  # BaseTrainer's TensorBoard logging needs tensorboard; the loop cost is the same
            default_root_dir=root_dir or tmp,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[Clock()],
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "does not have many workers" etc.: seed settings on purpose
            trainer.fit(SeedModule(), train_loader, val_loader)
        resolved_precision = str(trainer.precision)
    if monitor is not None:
        monitor.stop_monitoring()
    ends = marks["epoch_end"]
    if len(ends) < warmup_epochs + epochs:
        raise RuntimeError(f"Lightning ran {len(ends)} epochs, expected {warmup_epochs + epochs}")
    wall = ends[-1] - ends[warmup_epochs - 1] if warmup_epochs > 0 else None
    measured = slice(warmup_epochs, warmup_epochs + epochs)
    return {
        "wall_s": wall,
        "samples": sum(marks["samples"][measured]),
        "data_wait_s": sum(marks["data_s"][measured]),
        "step_s": sum(marks["step_s"][measured]),
        "precision_requested": precision,
        "precision_resolved": resolved_precision,
        "loader": loader,
    }
