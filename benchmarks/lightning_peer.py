"""PyTorch Lightning, the peer plainloop is measured against, in two set-ups.

`SEED_PEER`: Lightning configured as seed 000's BaseTrainer: precision "16-mixed", num_workers=8,
pin_memory=True, persistent_workers=True, prefetch_factor=2, batch 150, torch's AdamW, validation every epoch
(Lightning's default), Lightning's progress bar and checkpointing left on. It reads plainloop's cached dataset
(memory-mapped .npy) through a DataLoader: what a seed user runs.

`SAME_DATA_PEER`: Lightning given exactly plainloop's data path, so that only the loop differs: the same
in-memory dataset gathered by index (`dataset.gather`, plainloop's own `ShardedBatchSampler` order, drop_last),
0 workers, plainloop's resolved precision, the same batch, plainloop's AdamW (`trainer.optim.build_adamw`:
fused on CUDA, no decay on biases and norms), validation when plainloop validates (the last epoch),
checkpointing on (plainloop writes last.pt every epoch), and no logger, progress bar or model summary.
Lightning is a benchmark-only dependency (requirements-bench.txt).
"""

from __future__ import annotations

import tempfile
import time
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

SEED_LOADER = {"num_workers": 8, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 2}
SEED_PEER: dict[str, Any] = {"data": "loader", "progress_bar": True, "optimizer": "torch", "val_every": 1}
SAME_DATA_PEER: dict[str, Any] = {
    "data": "gather",
    "progress_bar": False,
    "optimizer": "plainloop",
    "val_every": None,
}
LIGHTNING_PRECISION = {"32": "32-true", "bf16-mixed": "bf16-mixed", "16-mixed": "16-mixed"}


def lightning_available() -> str | None:
    """Lightning's version, or None when it is not installed (the harness then skips this row and says so)."""
    try:
        import lightning

        return str(lightning.__version__)
    except ImportError:
        return None


class GatherBatches(Dataset):
    """Whole batches from a dataset held in memory: `[idx_array]` -> `dataset.gather(idx)`, plainloop's path.

    Used with `DataLoader(batch_size=None, sampler=<a batch sampler>)`, so there is no per-sample
    `__getitem__` and no collate: the same work plainloop's `DeviceBatches` does per step.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: Any) -> Any:
        return self.dataset.gather(torch.as_tensor(idx, dtype=torch.long))


def _loaders(
    train_set: Dataset,
    val_set: Dataset | None,
    device: torch.device,
    batch_size: int,
    peer: dict[str, Any],
    loader: dict[str, Any],
    seed: int,
) -> tuple[DataLoader, DataLoader | None]:
    if peer["data"] == "gather":
        from trainer.data import ShardedBatchSampler

        for ds in (train_set, val_set):  # plainloop's residency: the split's normalised array in memory
            if ds is not None and not ds.maybe_to_device(device):
                raise RuntimeError(f"{type(ds).__name__} refused to be held on {device}: no like-for-like row")
        order = ShardedBatchSampler(len(train_set), batch_size, seed=seed, drop_last=True)
        train = DataLoader(GatherBatches(train_set), batch_size=None, sampler=order)
        val = None
        if val_set is not None and len(val_set):
            val_order = ShardedBatchSampler(len(val_set), batch_size, shuffle=False, drop_last=False)
            val = DataLoader(GatherBatches(val_set), batch_size=None, sampler=val_order)
        return train, val
    kw = dict(loader)
    if kw.get("num_workers", 0) == 0:
        kw.pop("persistent_workers", None)
        kw.pop("prefetch_factor", None)
    train = DataLoader(train_set, batch_size=batch_size, shuffle=True, **kw)
    val = DataLoader(val_set, batch_size=batch_size, shuffle=False, **kw) if val_set is not None else None
    return train, val


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
    peer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fit for warmup_epochs + epochs; time the last `epochs` (training + validation + checkpointing).

    `peer` is SEED_PEER (default) or SAME_DATA_PEER; `loader` the DataLoader settings of the "loader" peer.
    """
    import lightning as L

    peer = dict(SEED_PEER if peer is None else peer)
    loader = dict(SEED_LOADER if loader is None else loader)
    total = warmup_epochs + epochs
    torch.manual_seed(seed)
    train_loader, val_loader = _loaders(train_set, val_set, device, batch_size, peer, loader, seed)

    class SeedModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = self.model.loss(self.model(x), y)
            self.log("train_loss", loss, prog_bar=peer["progress_bar"])
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", self.model.loss(self.model(x), y), prog_bar=peer["progress_bar"])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            if peer["optimizer"] == "plainloop":
                from trainer.optim import build_adamw

                return build_adamw(self.model, lr, 0.01, device, tensor_lr=False)
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

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
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

    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(
            accelerator="gpu" if device.type == "cuda" else "cpu",
            devices=1,
            precision=precision,
            max_epochs=total,
            logger=False,  # BaseTrainer's TensorBoard logging needs tensorboard; the loop cost is the same
            default_root_dir=root_dir or tmp,
            enable_model_summary=False,
            enable_progress_bar=peer["progress_bar"],
            check_val_every_n_epoch=peer["val_every"] or total,  # None: the last epoch, as plainloop
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
    if len(ends) < total:
        raise RuntimeError(f"Lightning ran {len(ends)} epochs, expected {total}")
    wall = ends[-1] - ends[warmup_epochs - 1] if warmup_epochs > 0 else None
    measured = slice(warmup_epochs, total)
    return {
        "wall_s": wall,
        "samples": sum(marks["samples"][measured]),
        "steps": len(train_loader) * epochs,
        "data_wait_s": sum(marks["data_s"][measured]),
        "step_s": sum(marks["step_s"][measured]),
        "precision_requested": precision,
        "precision_resolved": resolved_precision,
        "loader": {"gather": "dataset.gather, 0 workers"} if peer["data"] == "gather" else loader,
        "peer": peer,
    }
