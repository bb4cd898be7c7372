"""Run by tests/test_ddp.py under torchrun: a toy task with DDP on CPU (gloo).

argv: OUT [MODE]. MODE "signal": rank 1 alone gets a SIGTERM in its 5th batch; "signal_epoch_end": in the epoch's
last batch, after the ranks' last agreement of that epoch; "early_stop": six epochs at a learning rate too small to
improve, patience 1 (rank 0 scores the validation, every rank must stop with it); "test_with_best": two epochs, the
first validation is the best, the test split is scored with best.pt; "agent_sigterm": a loader worker per rank,
and rank 0 sends SIGTERM to the torchrun agent in its 5th batch (the agent passes it to each rank's process group);
"resume": argv[3] is a run directory to resume; "diverge": every training input is NaN, so every step is skipped
and the run stops as diverged after 2 (max_consecutive_skips) on every rank; "lightning": a module shaped like a
LightningModule (training_step, validation_step, self.log, its own optimizer and step scheduler); "auto_cadence":
seven epochs at the auto validation cadence, where only rank 0 measures a validation's cost and the decision (every 3
epochs when the cost is above 0) must reach rank 1 too.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer.config import TrainConfig
from trainer.loop import Trainer
from trainer.runtime import cleanup_distributed
from trainer.task import Task

out = sys.argv[1]
g = torch.Generator().manual_seed(0)
x = torch.randn(512, 8, generator=g)
y = x.sum(1, keepdim=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
mode = sys.argv[2] if len(sys.argv) > 2 else ""
cfg = TrainConfig(
    epochs={"early_stop": 6, "test_with_best": 2, "resume": 2, "auto_cadence": 7}.get(mode, 1),
    batch_size=16,
    accumulate_grad_batches=2,
    # "agent_sigterm": a DataLoader with a worker process per rank, instead of batches gathered from memory
    num_workers=1 if mode == "agent_sigterm" else 0,
    device_cache=False if mode == "agent_sigterm" else None,
    output_dir=out,
    run_name="ddp",
    progress_bar=False,
    log_every=2,
    validation_interval=None if mode == "auto_cadence" else 1,
    early_stopping_patience=1 if mode == "early_stop" else None,
    lr=1e-12 if mode == "early_stop" else 1e-3,
    test_with_best=mode == "test_with_best",
    resume=sys.argv[3] if mode == "resume" else None,
    **({"max_consecutive_skips": 2} if mode == "diverge" else {}),
)
# the batch (16 per epoch and rank) in which rank 1 gets a SIGTERM (rank 0 signals the agent)
SIGNAL_AT = {"signal": 5, "signal_epoch_end": 16, "agent_sigterm": 5}.get(mode)


class SignalRank1:
    """A monitor that sends rank 1 (only) a SIGTERM during batch SIGNAL_AT: the ranks must agree to stop."""

    def __init__(self) -> None:
        self.n = 0

    def start_monitoring(self) -> None: ...

    def stop_monitoring(self) -> None: ...

    def get_summary(self) -> dict:
        return {}

    def log_iteration(self, *a) -> None:
        self.n += 1
        if self.n == SIGNAL_AT and mode == "agent_sigterm" and os.environ.get("RANK") == "0":
            os.kill(os.getppid(), signal.SIGTERM)  # the torchrun agent, as a user or SLURM would signal it
            t_end = time.monotonic() + 600  # until the agent's SIGTERM reaches this rank; the deadline only ends a hang
            while not trainer.run.stop.signum and time.monotonic() < t_end:
                time.sleep(0.01)
        elif self.n == SIGNAL_AT and mode != "agent_sigterm" and os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGTERM)


def evaluate(m: nn.Module, split: str, device: torch.device) -> dict[str, float]:
    """Validation scores that only get worse (the first is the best); the test split's true loss."""
    if split == "val":
        calls.append(split)
        return {"val_loss": float(len(calls))}
    return {"test_loss": float(((m(x[64:128]) - y[64:128]) ** 2).mean())}


class LitToy(nn.Module):
    """A LightningModule's methods on a plain module: DDP must still see each step (the loss goes through forward)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self(batch[0]), batch[1])
        self.log("train_mse", loss)
        return {"loss": loss}

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.mse_loss(self(batch[0]), batch[1]))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


if mode == "lightning":
    model = LitToy(model)
if mode == "auto_cadence":  # rank 1 measures nothing: only rank 0's figures, broadcast, give every rank the cadence
    import trainer.evaluation as ev

    measured = ev.ValidationCadence.measured
    ev.ValidationCadence.measured = lambda c, epoch, val_s, since_s: measured(  # type: ignore[method-assign]
        c, epoch, val_s if os.environ.get("RANK") == "0" else 0.0, since_s
    )
    ev.throttled_every = lambda val_s, epoch_s, every: 3 if val_s > 0 else every
calls: list[str] = []
monitor = SignalRank1() if SIGNAL_AT else None
train_x = torch.full_like(x, float("nan")) if mode == "diverge" else x
task = Task("toy", model, TensorDataset(train_x, y), TensorDataset(x[:64], y[:64]))
if mode == "test_with_best":
    task.test_set, task.evaluate_fn = TensorDataset(x[64:128], y[64:128]), evaluate
trainer = Trainer(cfg, task, monitor=monitor)
trainer.fit()  # the trainer stays referenced, as in a user script
# Linux: after the exit-time cleanup no gloo thread may be left to outlive the interpreter
if os.path.isdir("/proc/self/task"):
    cleanup_distributed()
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{t}/comm").read_text())
        except FileNotFoundError:  # a thread that ended after the listing: not left over
            pass
    left = sum("gloo" in n for n in names)
    print(f"rank {os.environ.get('RANK', '0')}: gloo threads left after destroy_process_group: {left}")
