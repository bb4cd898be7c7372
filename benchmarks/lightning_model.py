"""A LightningModule as it is, trained by `lightning.Trainer` and by plainloop: seconds per epoch, final val loss.

The model is the kind users bring: a small transformer regressor whose `configure_optimizers` returns Lightning's
dict (AdamW weight_decay 0.05 + a LambdaLR with warm-up epochs, then cosine), with `training_step`,
`validation_step` and `self.log`. Both trainers do the same work per epoch: the same shuffled in-memory batches in
the main process, a validation and a checkpoint (Lightning's ModelCheckpoint(save_last=True, save_top_k=1);
plainloop's last.pt and best.pt). One thread, fp32, repetitions interleaved (L, P, P, L, ...). Seconds per epoch =
the median time between two `on_train_epoch_start` calls of the model itself (the same clock in both trainers; the
first epoch, with its start-up, is not counted).

    python -m benchmarks.lightning_model                 # ~2 min on a laptop core
    python -m benchmarks.lightning_model --quick         # a smoke run (tests)
"""

from __future__ import annotations

import copy
import logging
import math
import tempfile
import time
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.common import RESULTS_DIR, environment, parser, stats, write_result

FLAGS = [("--reps", 3, "repetitions per trainer, interleaved"), ("--epochs", 8, "epochs per run"),
         ("--samples", 2560, "samples, 80%% train"), ("--batch", 32, "batch size"),
         ("--quick", False, "a smoke run: 1 repetition, 3 epochs, 320 samples"),
         ("--out", str(RESULTS_DIR / "lightning_model_cpu.json"), "raw JSON (and .md beside it)")]  # fmt: skip


def make_model_class() -> type:
    import lightning as L

    class Regressor(L.LightningModule):
        def __init__(self, dim: int = 32, d_model: int = 64, warmup_epochs: int = 2, epochs: int = 8) -> None:
            super().__init__()
            self.proj, self.head = nn.Linear(dim, d_model), nn.Linear(d_model, dim)
            layer = nn.TransformerEncoderLayer(d_model, 4, 128, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.warmup_epochs, self.epochs = warmup_epochs, epochs
            self.epoch_starts: list[float] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.head(self.enc(self.proj(x)))
            return out

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = nn.functional.mse_loss(self(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", nn.functional.mse_loss(self(batch[0]), batch[1]))

        def on_train_epoch_start(self) -> None:
            self.epoch_starts.append(time.perf_counter())

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.05)
            w, e = self.warmup_epochs, self.epochs

            def f(ep: int) -> float:
                return (ep + 1) / w if ep < w else 0.5 * (1 + math.cos(math.pi * (ep - w) / max(1, e - w)))

            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(opt, f)}

    return Regressor


def make_data(n: int, seq: int, dim: int) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, seq, dim, generator=g)
    y = torch.roll(x, 1, dims=1).cumsum(1) / seq + 0.1 * torch.randn(n, seq, dim, generator=g)
    cut = int(0.8 * n)
    return TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])


def run_lightning(model: Any, train: Any, val: Any, epochs: int, batch: int, tmp: str) -> float:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    ckpt = ModelCheckpoint(dirpath=tmp, monitor="val_loss", save_top_k=1, save_last=True)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, logger=False, callbacks=[ckpt],
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        precision="32-true")  # fmt: skip
    g = torch.Generator().manual_seed(0)
    trainer.fit(model, DataLoader(train, batch_size=batch, shuffle=True, generator=g, drop_last=True),
                DataLoader(val, batch_size=batch))  # fmt: skip
    return float(trainer.callback_metrics["val_loss"])


def run_plainloop(model: Any, train: Any, val: Any, epochs: int, batch: int, tmp: str) -> float:
    from trainer import Task, TrainConfig, Trainer

    cfg = TrainConfig(epochs=epochs, batch_size=batch, validation_interval=1, num_workers=0, progress_bar=False,
                      output_dir=tmp, run_name="run", precision="32", log_every=50)  # fmt: skip
    return float(Trainer(cfg, Task("bench", model, train, val), log=lambda s: None).fit()["final_metrics"]["val_loss"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parser(__doc__, FLAGS).parse_args(argv)
    if a.quick:
        a.reps, a.epochs, a.samples = 1, 3, 320
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    train, val = make_data(a.samples, 16, 32)
    torch.manual_seed(0)
    m0, order = make_model_class()(epochs=a.epochs), ["lightning", "plainloop"]
    runs: list[dict[str, Any]] = []
    for r in range(a.reps):
        for name in order if r % 2 == 0 else order[::-1]:
            model = copy.deepcopy(m0)
            with tempfile.TemporaryDirectory() as tmp:
                t0, fit = time.perf_counter(), run_lightning if name == "lightning" else run_plainloop
                loss = fit(model, train, val, a.epochs, a.batch, tmp)
                # the end mark is taken after fit returned: the last epoch includes the end of fit (both trainers)
                marks = [*model.epoch_starts, time.perf_counter()]
            per = [y - x for x, y in zip(marks[1:], marks[2:])] or [marks[-1] - marks[0]]  # the first epoch left out
            runs.append({"trainer": name, "rep": r, "wall_s": marks[-1] - t0, "val_loss": loss,
                         "s_per_epoch": stats(per)["median"]})  # fmt: skip
            print(f"  {name:9s} rep {r}: {runs[-1]['s_per_epoch']:.3f} s/epoch, val_loss {loss:.5f}")
    by = {n: [x for x in runs if x["trainer"] == n] for n in order}
    per_epoch = {n: stats([x["s_per_epoch"] for x in v]) for n, v in by.items()}
    vloss = {n: stats([x["val_loss"] for x in v]) for n, v in by.items()}
    ratio = stats([p["s_per_epoch"] / q["s_per_epoch"] for p, q in zip(by["plainloop"], by["lightning"])])
    env, nb = environment(torch.device("cpu")), int(0.8 * a.samples) // a.batch
    result: dict[str, Any] = {
        "benchmark": "lightning_model", "env": env, "runs": runs, "s_per_epoch": per_epoch, "val_loss": vloss,
        "config": {"reps": a.reps, "epochs": a.epochs, "samples": a.samples, "batch": a.batch, "threads": 1,
                   "precision": "fp32", "batches_per_epoch": nb},
        "paired_ratio_plainloop_over_lightning": ratio,
    }  # fmt: skip
    md = ("# A LightningModule as it is: lightning.Trainer vs plainloop (CPU)\n\n"
          f"`python -m benchmarks.lightning_model` on {env['cpu']} ({env['cpu_count']} cores, 1 thread), torch "
          f"{env['torch']}, lightning {env['modules'].get('lightning')}, commit {str(env['commit'])[:12]}; {a.reps} "
          f"interleaved repetitions of {a.epochs} epochs, {nb} batches of {a.batch} per epoch, a validation and a "
          "checkpoint every epoch; the model's own AdamW + LambdaLR.\n\n"
          "| trainer | s/epoch (median) | min - max | final val loss (median) |\n|---|---|---|---|\n"
          + "".join(f"| {n} | {s['median']:.3f} | {s['min']:.3f} - {s['max']:.3f} | {vloss[n]['median']:.5f} |\n"
                    for n, s in per_epoch.items())
          + f"\nplainloop / Lightning time per epoch, paired by repetition: median {ratio['median']:.2f}x "
          f"(min {ratio['min']:.2f}, max {ratio['max']:.2f}).\n")  # fmt: skip
    write_result(a.out, result, md)
    return result


if __name__ == "__main__":
    main()
