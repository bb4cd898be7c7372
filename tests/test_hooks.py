"""The callback hooks (trainer/hooks.py, docs/guides/callbacks.md): order, counts, state in checkpoints, the
metrics-mutation contract, and the example callback of the guide."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import cut_short, metric_rows, toy_config
from tests.test_engine import make_task
from trainer import Trainer
from trainer.checkpoint import load_checkpoint
from trainer.hooks import HOOK_NAMES, Callback, Hooks

ROOT = Path(__file__).resolve().parents[1]


class Recorder(Callback):
    """Records every hook call as (name, details)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def on_fit_start(self, trainer: Any) -> None:
        self.calls.append(("on_fit_start", None))

    def on_load_checkpoint(self, trainer: Any, checkpoint: dict[str, Any]) -> None:
        self.calls.append(("on_load_checkpoint", checkpoint["step"]))

    def on_train_start(self, trainer: Any) -> None:
        self.calls.append(("on_train_start", trainer.step))

    def on_train_epoch_start(self, trainer: Any, epoch: int) -> None:
        self.calls.append(("on_train_epoch_start", epoch))

    def on_train_batch_start(self, trainer: Any, batch: Any, batch_idx: int) -> None:
        self.calls.append(("on_train_batch_start", (batch_idx, trainer.step)))

    def on_before_optimizer_step(self, trainer: Any, optimizer: torch.optim.Optimizer) -> None:
        assert optimizer is trainer.optimizer
        self.calls.append(("on_before_optimizer_step", trainer.step))

    def on_train_batch_end(self, trainer: Any, outputs: torch.Tensor, batch: Any, batch_idx: int) -> None:
        assert outputs.dim() == 0 and not outputs.requires_grad
        self.calls.append(("on_train_batch_end", (batch_idx, trainer.step)))

    def on_train_epoch_end(self, trainer: Any, epoch: int) -> None:
        self.calls.append(("on_train_epoch_end", epoch))

    def on_validation_start(self, trainer: Any) -> None:
        self.calls.append(("on_validation_start", trainer.step))

    def on_validation_end(self, trainer: Any, metrics: dict[str, float]) -> None:
        self.calls.append(("on_validation_end", sorted(metrics)))

    def on_save_checkpoint(self, trainer: Any, checkpoint: dict[str, Any]) -> None:
        self.calls.append(("on_save_checkpoint", checkpoint["step"]))

    def on_train_end(self, trainer: Any) -> None:
        self.calls.append(("on_train_end", trainer.step))

    def on_test_end(self, trainer: Any, metrics: dict[str, float]) -> None:
        self.calls.append(("on_test_end", sorted(metrics)))

    def on_fit_end(self, trainer: Any, summary: dict[str, Any]) -> None:
        self.calls.append(("on_fit_end", summary["steps"]))


def names(calls: list[tuple[str, Any]], *keep: str) -> list[str]:
    return [n for n, _ in calls if n in keep]


def test_every_hook_in_order_with_accumulation(tmp_path):
    """2 epochs of 8 batches, accumulate 3 (windows 3, 3, 2): 3 optimizer steps per epoch, 6 in all."""
    rec = Recorder()
    t = Trainer(toy_config(tmp_path, accumulate_grad_batches=3, save_best=False), make_task(), callbacks=[rec])
    t.fit()
    counts = {n: sum(c == n for c, _ in rec.calls) for n in HOOK_NAMES}
    assert counts == {
        "on_fit_start": 1,
        "on_load_checkpoint": 0,
        "on_train_start": 1,
        "on_train_epoch_start": 2,
        "on_train_batch_start": 16,
        "on_before_optimizer_step": 6,
        "on_train_batch_end": 16,
        "on_train_epoch_end": 2,
        "on_validation_start": 2,
        "on_validation_end": 2,
        "on_save_checkpoint": 2,  # last.pt after each epoch's validation (interval 0; the end), save_best off
        "on_log": 0,  # Recorder does not define it
        "on_train_end": 1,
        "on_test_end": 0,  # the toy task has no test split
        "on_fit_end": 1,
    }
    # one epoch, batch by batch: the optimizer step happens between a window's last batch start and its end
    epoch0 = rec.calls[rec.calls.index(("on_train_epoch_start", 0)) : rec.calls.index(("on_train_epoch_end", 0)) + 1]
    assert [c for c in epoch0 if c[0] != "on_train_batch_start"][:4] == [
        ("on_train_epoch_start", 0),
        ("on_train_batch_end", (0, 0)),
        ("on_train_batch_end", (1, 0)),
        ("on_before_optimizer_step", 0),  # before the step: trainer.step still counts the steps done
    ]
    ends = [d for n, d in epoch0 if n == "on_train_batch_end"]
    assert ends == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 1), (5, 2), (6, 2), (7, 3)]  # after the step that closed it
    # the run level: fit start -> train start -> epochs (train, epoch end, validation, checkpoint) -> end -> fit end
    top = names(
        rec.calls,
        "on_fit_start",
        "on_train_start",
        "on_train_epoch_end",
        "on_save_checkpoint",
        "on_validation_start",
        "on_validation_end",
        "on_train_end",
        "on_fit_end",
    )
    assert top == ["on_fit_start", "on_train_start"] + [
        "on_train_epoch_end",
        "on_validation_start",
        "on_validation_end",
        "on_save_checkpoint",
    ] * 2 + ["on_train_end", "on_fit_end"]
    assert ("on_validation_end", ["val_loss"]) in rec.calls


class Counter(Callback):
    """A callback with state: batches seen, saved in checkpoints."""

    state_key = "counter"

    def __init__(self) -> None:
        self.batches = 0
        self.loaded: dict[str, Any] | None = None

    def on_train_batch_end(self, trainer: Any, outputs: torch.Tensor, batch: Any, batch_idx: int) -> None:
        self.batches += 1

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = state["batches"]

    def on_load_checkpoint(self, trainer: Any, checkpoint: dict[str, Any]) -> None:
        self.loaded = {"batches_then": self.batches, "step": trainer.step}


def test_callback_state_is_saved_and_restored_on_resume(tmp_path):
    first = Trainer(toy_config(tmp_path, epochs=3), make_task(), callbacks=[Counter()])
    cut_short(first, max_epochs=2)  # interrupted after epoch 2
    first.fit()
    ck = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert ck["callbacks"] == {"counter": {"batches": 16}}
    again = Counter()
    rest = Trainer(toy_config(tmp_path, epochs=3, resume=str(tmp_path / "run")), make_task(), callbacks=[again])
    # restored before on_load_checkpoint, which sees the engine's state already in place
    assert again.loaded == {"batches_then": 16, "step": 16}
    without = Trainer(toy_config(tmp_path, epochs=3, resume=str(tmp_path / "run")), make_task())
    assert "resume: no callback of this run takes the saved state of counter" in without.notes
    rest.fit()
    assert again.batches == 24
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["callbacks"]["counter"] == {"batches": 24}


def test_checkpoints_without_stateful_callbacks_have_no_callbacks_entry(tmp_path):
    Trainer(toy_config(tmp_path, epochs=1), make_task(), callbacks=[Recorder()]).fit()
    assert "callbacks" not in load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")


def test_two_callbacks_under_one_state_key_are_refused():
    with pytest.raises(ValueError, match="'counter'.*state_key"):
        Hooks([Counter(), Counter()], trainer=object(), is_main=True)


class Swap(Callback):
    """Stands in for an EMA callback: replaces the score with its own and keeps the raw one as raw_val_loss."""

    def __init__(self, scores: list[float]) -> None:
        self.scores = scores

    def on_validation_end(self, trainer: Any, metrics: dict[str, float]) -> None:
        metrics["raw_val_loss"] = metrics["val_loss"]
        metrics["val_loss"] = self.scores.pop(0)


def test_metrics_changed_by_on_validation_end_drive_best_logging_and_early_stopping(tmp_path):
    # the model's own val_loss falls; the callback's scores get worse after the first: best.pt stays at step 8
    t = Trainer(
        toy_config(tmp_path, epochs=5, early_stopping_patience=2),
        make_task(),
        callbacks=[Swap([1.0, 2.0, 3.0, 4.0, 5.0])],
    )
    summary = t.fit()
    vals = [r for r in metric_rows(tmp_path / "run") if r["kind"] == "val"]
    assert [r["val_loss"] for r in vals] == [1.0, 2.0, 3.0]  # logged as changed; stopped after 2 without a gain
    assert all(r["raw_val_loss"] > 0 for r in vals)
    assert summary["steps"] == 24 and summary["best"] == {"val_loss": 1.0}
    assert summary["final_metrics"]["val_loss"] == 3.0
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt")["step"] == 8
    assert any("early stopping: val_loss did not improve for 2 validations" in n for n in t.notes)


def test_rank_filter_and_all_ranks():
    """On a rank other than 0 only callbacks with all_ranks = True are called; state is kept for all."""

    class Everywhere(Counter):
        all_ranks = True
        state_key = "everywhere"

    rank0_only, everywhere = Counter(), Everywhere()
    hooks = Hooks([rank0_only, everywhere], trainer=object(), is_main=False)
    assert hooks.batch_end == [everywhere.on_train_batch_end]
    assert set(hooks.state_dict()) == {"counter", "everywhere"}
    assert Hooks([rank0_only], trainer=object(), is_main=False).batch_end == []


def guide_example() -> dict[str, Any]:
    """The example callback of docs/guides/callbacks.md, executed as written there."""
    text = (ROOT / "docs" / "guides" / "callbacks.md").read_text(encoding="utf-8")
    marker = "<!-- example: tested-by tests/test_hooks.py::test_the_guides_example_callback -->"
    code = re.search(re.escape(marker) + r"\s*```python\n(.*?)```", text, re.S)
    assert code, "docs/guides/callbacks.md lost its example block"
    scope: dict[str, Any] = {}
    exec(compile(code.group(1), "docs/guides/callbacks.md", "exec"), scope)
    return scope


def test_the_guides_example_callback(tmp_path):
    scope = guide_example()
    cb = scope["RootMeanSquare"]()
    summary = Trainer(toy_config(tmp_path), make_task(), callbacks=[cb]).fit()
    vals = [r for r in metric_rows(tmp_path / "run") if r["kind"] == "val"]
    assert len(vals) == 2 and all(r["val_rmse"] == pytest.approx(math.sqrt(r["val_loss"])) for r in vals)
    assert summary["validations"] == 2
    # the end's last.pt is written after the last validation: it holds both
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["callbacks"] == {
        "RootMeanSquare": {"validations": 2}
    }


def test_schedules_follow_the_schedule_protocol(tmp_path):
    """WarmupCosine and ConstantSchedule are both `Schedule`s; OptimizerStep drives either."""
    from trainer.optim import ConstantSchedule, Schedule, WarmupCosine
    from trainer.step import OptimizerStep

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    assert isinstance(WarmupCosine(torch.optim.SGD(model.parameters(), lr=0.5), 10, 2), Schedule)
    const = ConstantSchedule(opt)
    assert isinstance(const, Schedule)
    step = OptimizerStep(opt, const, torch.device("cpu"), fp16=False)
    step.backward(model(torch.ones(4, 2)).sum())
    step.step()
    assert const.current_lr() == 0.5 and const.state_dict() == {}


def test_on_before_optimizer_step_sees_the_gradients_before_clipping(tmp_path):
    """As in Lightning: a callback that logs the gradient norm there sees the true one, not the clipped one."""
    seen: list[float] = []

    class Norms(Callback):
        def on_before_optimizer_step(self, trainer: Any, optimizer: torch.optim.Optimizer) -> None:
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            seen.append(float(torch.nn.utils.get_total_norm(grads)))

    Trainer(toy_config(tmp_path, epochs=1, gradient_clip_val=1e-3), make_task(), callbacks=[Norms()]).fit()
    assert seen and min(seen) > 1e-3 * 1.01  # clipped, every norm would be 1e-3


def test_two_callbacks_with_one_state_key_are_refused_before_anything_is_written(tmp_path):
    """The clash surfaced at the first checkpoint, after an epoch of training and with a run directory made."""
    with pytest.raises(ValueError, match=r"two callbacks save their state under 'counter'.*state_key"):
        Trainer(toy_config(tmp_path, epochs=1), make_task(), callbacks=[Counter(), Counter()])
    t = Trainer(toy_config(tmp_path, epochs=1), make_task(), callbacks=[Counter()])
    t.callbacks.append(Counter())  # added after the constructor: refused when fit() starts
    with pytest.raises(ValueError, match="two callbacks save their state under"):
        t.fit()
    assert not (tmp_path / "run").exists()
