"""Run by tests/test_fsdp.py under torchrun (gloo, CPU): the same seeded task under --strategy ddp or fsdp.

argv: OUT STRATEGY [EPOCHS [RESUME_DIR]]. A model of repeated blocks in an nn.ModuleList (the FSDP units), two
epochs by default, accumulation 2, clipping; the summary and the final validation loss land in OUT/<strategy>.
FSDP_SCRIPT_NAN=1: one micro-batch of rank 1 has a NaN loss (gradients finite): its step must be skipped on
every rank. FSDP_SCRIPT_SIGNAL=1: rank 1 alone is sent a SIGTERM in its 5th batch.
"""

import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

import trainer  # noqa: F401  (the layers plug in: --strategy fsdp)
from trainer.config import TrainConfig
from trainer.loop import Trainer
from trainer.task import Task


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block(16) for _ in range(3))
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


out, strategy = sys.argv[1], sys.argv[2]
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
resume = sys.argv[4] if len(sys.argv) > 4 else None
g = torch.Generator().manual_seed(0)
x = torch.randn(384, 8, generator=g)
y = x.sum(1, keepdim=True)
torch.manual_seed(0)
cfg = TrainConfig(
    epochs=epochs, batch_size=16, accumulate_grad_batches=2, strategy=strategy, output_dir=out, run_name=strategy,
    progress_bar=False, log_every=2, lr=3e-3, gradient_clip_val=1.0, resume=resume, shuffle=False, seed=0,
    test_with_best=True, warmup_steps=0,
    lr_decay_steps=10,  # one schedule whatever the length: a resumed run continues it exactly
)  # fmt: skip
nan_mode = bool(os.environ.get("FSDP_SCRIPT_NAN"))
calls = [0]


def loss_with_a_nan(model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    """Rank 1's 3rd micro-batch has a NaN loss with finite gradients (the NaN never reaches the model): only
    rank 1's own check can see it."""
    calls[0] += 1
    loss = nn.functional.mse_loss(model(batch[0]), batch[1])
    return loss + (float("nan") if calls[0] == 3 and os.environ.get("RANK") == "1" else 0.0)


task = Task("toy", Net(), TensorDataset(x[:320], y[:320]), TensorDataset(x[320:], y[320:]))
task.loss_fn = loss_with_a_nan if nan_mode else None
task.test_set = TensorDataset(x[320:352], y[320:352])  # scored by every rank under fsdp (rank 0's under ddp)


class SignalRank1:
    """FSDP_SCRIPT_SIGNAL=1: rank 1 alone gets a SIGTERM in its 5th batch; every rank must stop and save together."""

    all_ranks = True  # called on every rank

    def on_train_batch_end(self, *args: object) -> None:
        calls[0] += 1
        if calls[0] == 5 and os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGTERM)


callbacks = [SignalRank1()] if os.environ.get("FSDP_SCRIPT_SIGNAL") else []
Trainer(cfg, task, callbacks=callbacks).fit()
