"""When last.pt is written (by time, at the end, on a stop), what an epoch's end costs, and the resume rules."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.helpers import metric_rows, toy_config
from tests.test_engine import make_task, weights
from trainer import Callback, TrainConfig, Trainer
from trainer.checkpoint import load_checkpoint
from trainer.finish import TrainingStopped
from trainer.state import RESUME_MAY_CHANGE, TABLE_MAY_CHANGE, ResumeError, RunFinished, SaveClock, resume_changes

ROOT = Path(__file__).resolve().parents[1]


class Saves(Callback):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_save_checkpoint(self, trainer, checkpoint):
        self.steps.append(checkpoint["step"])


def test_the_clock_is_due_after_its_interval_or_at_epoch_ends_when_zero(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("trainer.state.time.perf_counter", lambda: now[0])
    clock = SaveClock(60.0)
    assert not clock.due(epoch_end=True) and not clock.due(epoch_end=False)
    now[0] = 159.9
    assert not clock.due(epoch_end=True)
    now[0] = 160.0
    assert clock.due(epoch_end=False) and clock.due(epoch_end=True)
    clock.reset()
    assert not clock.due(epoch_end=True)
    every_epoch = SaveClock(0.0)
    assert every_epoch.due(epoch_end=True) and not every_epoch.due(epoch_end=False)


def test_by_default_a_short_run_writes_last_pt_once_at_the_end(tmp_path):
    """5 epochs in a second or two: one last.pt (the end's), and no epoch line claims a save."""
    saves, lines = Saves(), []
    cfg = toy_config(tmp_path, epochs=5, checkpoint_interval=TrainConfig.checkpoint_interval, save_best=False)
    assert cfg.checkpoint_interval == 60.0
    Trainer(cfg, make_task(), callbacks=[saves], log=lines.append).fit()
    assert saves.steps == [40]
    epoch_lines = [ln for ln in lines if ln.startswith("[epoch ")]
    assert len(epoch_lines) == 5 and not any("last.pt" in ln for ln in epoch_lines)
    ck = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert ck["ended"] == "finished" and ck["val_pending"] is None and ck["last_val"]["val_loss"] > 0


def test_a_due_interval_saves_at_the_next_log_point_and_that_save_resumes_exactly(tmp_path):
    """An interval that is always due: last.pt at every log point (steps 4, 12 mid-epoch) and epoch end; a
    resume from the mid-epoch one (step 12) ends with the uninterrupted run's weights."""
    saves = Saves()
    straight = Trainer(toy_config(tmp_path, run_name="s", checkpoint_interval=1e-9, save_best=False), make_task(),
                       callbacks=[saves])  # fmt: skip
    straight.fit()
    assert saves.steps == [4, 8, 12, 16]

    class StopAt12(Callback):
        def on_save_checkpoint(self, trainer, checkpoint):
            if checkpoint["step"] == 12:
                raise KeyboardInterrupt  # stands for kill -9 right after that file is whole

    part = Trainer(toy_config(tmp_path, run_name="p", checkpoint_interval=1e-9, save_best=False), make_task())
    part.callbacks.append(StopAt12())
    with pytest.raises(KeyboardInterrupt):
        part.fit()
    assert load_checkpoint(tmp_path / "p" / "checkpoints" / "last.pt")["step"] == 8  # the hook runs before the write
    rest = Trainer(toy_config(tmp_path, run_name="p", resume=str(tmp_path / "p"), save_best=False), make_task())
    rest.fit()
    for a, b in zip(weights(straight.raw_model), weights(rest.raw_model)):
        assert torch.equal(a, b)


def test_a_stop_signal_writes_last_pt_whatever_the_interval(tmp_path):
    t = Trainer(toy_config(tmp_path, epochs=3, checkpoint_interval=3600.0), make_task())
    real, seen = t.forward_backward, []

    def signalled(*a, **k):
        seen.append(1)
        if len(seen) == 11:  # mid-epoch 2
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    t.forward_backward = signalled
    with pytest.raises(TrainingStopped):
        t.fit()
    ck = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert ck["step"] == 11 and ck["batches_done"] == 3 and ck["ended"] is None


def test_an_epoch_end_reads_the_device_once(tmp_path, monkeypatch):
    """2-step epochs, no validation, no save due: each epoch end costs the engine one read of the device (the log
    point: loss, skip counters and lr in one transfer). 20 epochs read 10 times more than 10 epochs do; what a run
    reads once (its start, its end's save and summary) is the same in both."""
    trainer_dir = str(ROOT / "trainer")

    def reads_of(epochs: int) -> Counter[str]:
        reads: Counter[str] = Counter()

        def counting(name):
            real = getattr(torch.Tensor, name)

            def read(self, *a, **k):
                caller = sys._getframe(1).f_code.co_filename
                if caller.startswith(trainer_dir):
                    reads[f"{name} {Path(caller).name}"] += 1
                return real(self, *a, **k)

            return read

        cfg = toy_config(tmp_path, run_name=f"e{epochs}", epochs=epochs, batch_size=128, log_every=1000,
                         checkpoint_interval=3600.0, save_best=False)  # fmt: skip
        t = Trainer(cfg, make_task(val=False))
        assert t.batches_per_epoch == 2
        monkeypatch.setattr(t.opt, "host_reads", False)  # as on a GPU: the skip flag stays on the device
        with monkeypatch.context() as m:
            for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
                m.setattr(torch.Tensor, name, counting(name))
            t.fit()
        return reads

    ten, twenty = reads_of(10), reads_of(20)
    assert twenty - ten == Counter({"tolist loop.py": 10}), (ten, twenty)


def test_orders_drawn_ahead_are_the_orders_drawn_one_at_a_time():
    """Short epochs draw the next epochs' orders together: every epoch's batches stay default_rng([seed, epoch])'s
    permutation, whatever the order of the epochs asked for (in sequence, a jump back, the same epoch twice, a new
    seed, a resume mid-epoch) and on every rank."""
    import numpy as np

    from trainer.data import ShardedBatchSampler

    def expected(seed: int, epoch: int, rank: int = 0, world: int = 1) -> list[list[int]]:
        mine = np.random.default_rng([seed, epoch]).permutation(200)[rank::world]
        return [mine[b * 50 : (b + 1) * 50].tolist() for b in range(len(mine) // 50)]

    s = ShardedBatchSampler(200, 50, seed=3)
    for epoch in [*range(45), 7, 7, 44, 45, 46]:
        s.set_epoch(epoch)
        assert [b.tolist() for b in s] == expected(3, epoch), epoch
    assert s._ahead and len(s._ahead) < s.AHEAD_EPOCHS  # drawn ahead, and only so far
    s.seed = 4
    s.set_epoch(47)
    assert [b.tolist() for b in s] == expected(4, 47)
    s.load_state_dict({"epoch": 48, "batches_done": 2})  # a resume mid-epoch: the batches left of its order
    assert [b.tolist() for b in s] == expected(4, 48)[2:]
    two = [ShardedBatchSampler(200, 50, seed=3, rank=r, world_size=2) for r in range(2)]
    for epoch in range(40):
        for r, sampler in enumerate(two):
            sampler.set_epoch(epoch)
            assert [b.tolist() for b in sampler] == expected(3, epoch, r, 2)


def test_every_epoch_trains_with_every_module_in_training_mode(tmp_path):
    """The epoch's start calls model.train() only when it changes something: a module a callback left in eval
    mode trains again, and a model whose train() does more than set the flags has it called every epoch."""

    class Overrides(torch.nn.Linear):
        calls = 0

        def train(self, mode: bool = True):
            Overrides.calls += 1
            return super().train(mode)

    class Watch(Callback):
        def __init__(self) -> None:
            self.modes: list[bool] = []

        def on_train_batch_start(self, trainer, batch, batch_idx):
            self.modes.append(all(m.training for m in trainer.raw_model.modules()))

        def on_train_epoch_end(self, trainer, epoch):
            trainer.raw_model[0].eval()  # left in eval mode: the next epoch must train it again

    watch, task = Watch(), make_task(val=False)
    Trainer(toy_config(tmp_path, run_name="a", epochs=3, save_best=False), task, callbacks=[watch]).fit()
    assert len(watch.modes) == 3 * 8 and all(watch.modes)
    task = make_task(val=False)
    task.model[3] = Overrides(32, 1)
    Trainer(toy_config(tmp_path, run_name="b", epochs=3, save_best=False), task).fit()
    assert Overrides.calls >= 3  # at least once per epoch (validation and tests may add their own)


# ------------------------------------------------------------------------------------------- resume rules
def _finished_run(tmp_path: Path, **kw) -> Path:
    Trainer(toy_config(tmp_path, **kw), make_task()).fit()
    return tmp_path / "run"


def test_a_changed_fixed_setting_is_refused_with_both_values(tmp_path):
    run = _finished_run(tmp_path, epochs=1)
    for change, shown in (({"lr": 0.5}, "lr 0.001 -> 0.5"), ({"batch_size": 16}, "batch_size 32 -> 16")):
        with pytest.raises(ResumeError, match=re.escape(shown)):
            Trainer(toy_config(tmp_path, epochs=2, resume=str(run), **change), make_task())


def test_the_python_door_is_told_how_to_resume_with_the_runs_own_settings_and_that_works(tmp_path):
    """From Python (no command line running) the refusal names config.toml's [train] table, not --resume."""
    tomllib = pytest.importorskip("tomllib")
    run = _finished_run(tmp_path, epochs=1)
    changed = dict(toy_config(tmp_path, epochs=1).to_dict(), batch_size=16, epochs=2, resume=str(run))
    with pytest.raises(ResumeError) as e:
        Trainer(TrainConfig(**changed), make_task())
    assert "--resume" not in str(e.value) and str(run / "config.toml") in str(e.value)
    with open(run / "config.toml", "rb") as f:
        own = tomllib.load(f)["train"]
    t = Trainer(TrainConfig(**dict(own, epochs=2), resume=str(run)), make_task())  # what the message says
    assert t.fit()["steps"] == 16


def test_a_setting_that_may_change_continues_the_run(tmp_path):
    run = _finished_run(tmp_path, epochs=1)
    t = Trainer(toy_config(tmp_path, epochs=2, resume=str(run), log_every=2, checkpoint_interval=5.0), make_task())
    assert t.fit()["steps"] == 16


def test_a_finished_or_early_stopped_run_is_not_scored_again(tmp_path):
    run = _finished_run(tmp_path, epochs=1)
    before = (run / "summary.json").read_bytes()
    with pytest.raises(RunFinished, match="finished at step 8"):
        Trainer(toy_config(tmp_path, epochs=1, resume=str(run)), make_task())
    assert (run / "summary.json").read_bytes() == before
    # an early stop: patience 0 stops after the first validation that does not improve
    (tmp_path / "e").mkdir()
    cfg = toy_config(tmp_path / "e", epochs=40, lr=3e-2, early_stopping_patience=1)
    first = Trainer(cfg, make_task()).fit()
    assert first["epochs"] < 40
    assert load_checkpoint(tmp_path / "e" / "run" / "checkpoints" / "last.pt")["ended"] == "early_stopped"
    summary = (tmp_path / "e" / "run" / "summary.json").read_bytes()
    with pytest.raises(RunFinished, match="stopped early"):
        Trainer(dataclasses.replace(cfg, resume=str(tmp_path / "e" / "run")), make_task())
    assert (tmp_path / "e" / "run" / "summary.json").read_bytes() == summary
    rows = [r for r in metric_rows(tmp_path / "e" / "run") if r["kind"] == "val"]
    assert len(rows) == first["epochs"]


def test_the_rule_compares_plain_values_and_skips_unknown_ones():
    old = {"train": {"lr": 0.001, "adam_betas": [0.9, 0.95], "log_every": 5, "seed": 1.0}, "task": {"offset": 0}}
    new = {"train": {"lr": 0.001, "adam_betas": (0.9, 0.95), "log_every": 9, "seed": 1}, "task": {"offset": 2}}
    assert resume_changes(old, new) == [("offset", 0, 2)]
    assert resume_changes({"train": {}}, {"train": {"lr": 1.0}}) == []  # not saved: not compared
    assert resume_changes(old, {"task": {"data_path": "/elsewhere", "offset": 0}}) == []


def test_every_setting_that_may_change_is_a_real_one_and_the_docs_list_them():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert RESUME_MAY_CHANGE <= fields, sorted(RESUME_MAY_CHANGE - fields)
    text = (ROOT / "docs" / "concepts" / "run-directory.md").read_text(encoding="utf-8")
    section = text.split("## What a resume may change", 1)[1].split("\n## ", 1)[0]
    bullets = section.split("Fixed is everything else", 1)[0]
    listed = set(re.findall(r"`([a-z_]+)`", bullets.split(":", 1)[1])) - {"resume_changes"}
    assert listed == RESUME_MAY_CHANGE | TABLE_MAY_CHANGE, sorted(listed ^ (RESUME_MAY_CHANGE | TABLE_MAY_CHANGE))


def test_checkpoints_of_every_earlier_layout_resume(tmp_path):
    """plainloop-1 kept the scaler at the top level and best as a number; plainloop-2 before the registry had no
    `ended`/`last_val`: all continue."""
    run = _finished_run(tmp_path, epochs=2, checkpoint_interval=0)
    ck = load_checkpoint(run / "checkpoints" / "last.pt")
    old = {k: v for k, v in ck.items() if k not in ("ended", "last_val", "opt_step", "digest", "integrity")}
    old["scaler"], old["best"] = ck["opt_step"]["scaler"], ck["best"]["best"]
    old["step"] = old["val_pending"] = 8
    old["epoch"], old["batches_done"] = 1, 0
    torch.save(old, tmp_path / "old.pt")
    t = Trainer(toy_config(tmp_path, run_name="n", epochs=2, resume=str(tmp_path / "old.pt")), make_task())
    assert t.progress.step == 8 and t.progress.val_pending == 8 and t.best.best == ck["best"]["best"]
    assert json.loads(json.dumps(t.fit()["steps"])) == 16
