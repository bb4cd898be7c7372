"""Run by tests/test_ddp.py under torchrun: one epoch of a toy task with DDP on CPU (gloo)."""

import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer.config import TrainConfig
from trainer.loop import Trainer
from trainer.setup import cleanup_distributed
from trainer.task import Task

out = sys.argv[1]
g = torch.Generator().manual_seed(0)
x = torch.randn(512, 8, generator=g)
y = x.sum(1, keepdim=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
cfg = TrainConfig(
    epochs=1,
    batch_size=16,
    accumulate_grad_batches=2,
    num_workers=0,
    output_dir=out,
    run_name="ddp",
    progress_bar=False,
    log_every=2,
    validation_interval=1,
)


class SignalRank1:
    """A monitor that sends rank 1 (only) a SIGTERM during its 5th batch: the ranks must agree to stop."""

    def __init__(self) -> None:
        self.n = 0

    def start_monitoring(self) -> None: ...

    def stop_monitoring(self) -> None: ...

    def get_summary(self) -> dict:
        return {}

    def log_iteration(self, *a) -> None:
        self.n += 1
        if self.n == 5 and os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGTERM)


monitor = SignalRank1() if len(sys.argv) > 2 and sys.argv[2] == "signal" else None
trainer = Trainer(cfg, Task("toy", model, TensorDataset(x, y), TensorDataset(x[:64], y[:64])), monitor=monitor)
trainer.fit()  # the trainer stays referenced, as in a user script
# Linux: after the exit-time cleanup no gloo thread may be left to outlive the interpreter
if os.path.isdir("/proc/self/task"):
    cleanup_distributed()
    names = [Path(f"/proc/self/task/{t}/comm").read_text() for t in os.listdir("/proc/self/task")]
    left = sum("gloo" in n for n in names)
    print(f"rank {os.environ['RANK']}: gloo threads left after destroy_process_group: {left}")
