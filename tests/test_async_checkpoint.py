"""last.pt written from a background thread (async_checkpoint): the same files, the same resume, errors surfaced.

On a GPU it is the default (the per-epoch save of a short epoch cost as much as its steps); here on the CPU the
tests switch it on to walk the same code.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import trainer.state as checkpointer_mod
from tests.helpers import cut_short, toy_config
from trainer import TrainConfig
from trainer.checkpoint import CheckpointError, load_checkpoint, snapshot_to_host
from trainer.finish import TrainingStopped
from trainer.loop import Trainer
from trainer.task import Task


def data(n: int = 256) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g))


def task(seed: int = 0) -> Task:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    return Task("toy", model, data(), TensorDataset(*data()[:64]))


def test_the_default_is_background_on_a_gpu_only(tmp_path):
    t = Trainer(toy_config(tmp_path, epochs=1), task())
    assert TrainConfig().async_checkpoint is None and t.checkpointer.background is False  # this CPU
    on = Trainer(toy_config(tmp_path, run_name="b", epochs=1, async_checkpoint=True), task())
    assert on.checkpointer.background


def test_snapshot_is_a_copy_training_cannot_change():
    w = torch.arange(4.0)
    state = {"model": OrderedDict(w=w), "opt": {"state": {0: {"step": torch.tensor(3.0)}}, "groups": [{"lr": 0.1}]}}
    snap = snapshot_to_host(state)
    w.add_(100.0)
    state["opt"]["groups"][0]["lr"] = 9.0
    assert torch.equal(snap["model"]["w"], torch.arange(4.0)) and snap["opt"]["groups"][0]["lr"] == 0.1
    assert type(snap["model"]) is OrderedDict and snap["opt"]["state"][0]["step"].item() == 3.0


def test_background_writes_resume_bit_identical_and_write_the_same_files(tmp_path):
    """4 epochs straight (in line) == 2 epochs with background writes + resume + 2 more, bit for bit."""
    straight = Trainer(toy_config(tmp_path, run_name="s", epochs=4), task())
    straight.fit()
    first = Trainer(toy_config(tmp_path, run_name="a", epochs=4, async_checkpoint=True), task())
    cut_short(first, max_epochs=2)
    first.fit()
    ck = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")
    assert ck["integrity"] == "verified" and ck["epoch"] == 2
    assert (tmp_path / "a" / "checkpoints" / "best.pt").is_file() and (tmp_path / "a" / "best.json").is_file()
    rest = Trainer(
        toy_config(tmp_path, run_name="a", epochs=4, async_checkpoint=True, resume=str(tmp_path / "a")), task(5)
    )
    rest.fit()
    for p, q in zip(straight.raw_model.parameters(), rest.raw_model.parameters()):
        assert torch.equal(p, q)
    assert not list((tmp_path / "a" / "checkpoints").glob("*.tmp"))


def test_checkpoint_events_reach_callbacks_on_the_loops_thread_after_the_file_is_whole(tmp_path):
    seen: list[tuple[str, bool, int]] = []

    class Watch:
        def on_log(self, trainer, row):
            if row.get("kind") == "checkpoint":
                ok = threading.current_thread() is threading.main_thread()
                seen.append((row["name"], ok, load_checkpoint(row["path"])["step"]))

    t = Trainer(toy_config(tmp_path, epochs=3, async_checkpoint=True), task(), callbacks=[Watch()])
    t.fit()
    lasts = [s for s in seen if s[0] == "last.pt"]
    assert len(lasts) == 3 and all(ok for _, ok, _ in seen)
    assert [step for _, _, step in lasts] == [8, 16, 24]  # each event names the file as that save wrote it


def test_best_pt_is_written_in_the_background_too_and_is_whole_when_fit_returns(tmp_path, monkeypatch):
    """A validation that improves queues best.pt like last.pt (the loop waits only for the copy); the run's end
    waits for it, and best.pt, best.json and their on_log events match the best validation."""
    names: list[str] = []
    real = checkpointer_mod.Checkpointer._write_in_background

    def spy(self, state, path, best, files):
        names.append(path.name)
        real(self, state, path, best, files)

    monkeypatch.setattr(checkpointer_mod.Checkpointer, "_write_in_background", spy)
    events: list[str] = []

    class Watch:
        def on_log(self, trainer, row):
            if row.get("kind") == "checkpoint":
                events.append(row["name"])

    t = Trainer(toy_config(tmp_path, epochs=3, async_checkpoint=True), task(), callbacks=[Watch()])
    t.fit()
    assert "best.pt" in names and events.count("best.pt") == names.count("best.pt")
    best = load_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt")
    assert (
        best["integrity"] == "verified"
        and best["step"] == json.loads((tmp_path / "run" / "best.json").read_text())["step"]
    )
    assert t.checkpointer._writer is None


def test_a_failed_background_write_stops_the_run_naming_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    real = checkpointer_mod.atomic_save
    calls = {"n": 0}

    def flaky(obj, path, **kw):
        calls["n"] += 1
        if calls["n"] == 2:  # the second last.pt: the disk is full
            raise OSError(28, "No space left on device")
        return real(obj, path, **kw)

    monkeypatch.setattr(checkpointer_mod, "atomic_save", flaky)
    t = Trainer(toy_config(tmp_path, epochs=4, validation_interval=10, async_checkpoint=True), task())
    with pytest.raises(CheckpointError, match=r"last\.pt in the background failed: .*No space left"):
        t.fit()
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["epoch"] == 1  # the previous one, whole


def test_a_stop_signal_waits_for_the_write_in_flight_then_saves_in_line(tmp_path):
    """SIGTERM mid-epoch 2: the epoch-1 background write finishes, the stop's last.pt is written at once."""

    class SignalAt:
        def on_log(self, trainer, row):
            if row.get("kind") == "train" and row["step"] == 12:
                os.kill(os.getpid(), signal.SIGTERM)

    t = Trainer(toy_config(tmp_path, epochs=2, log_every=1, async_checkpoint=True), task(), callbacks=[SignalAt()])
    with pytest.raises(TrainingStopped):
        t.fit()
    assert t.checkpointer._writer is None
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["step"] == 12


def test_in_line_saves_on_a_gpu_copy_the_state_to_host_once_first(tmp_path, monkeypatch):
    """The CUDA branch, walked on the CPU: the checkpointer told its device is a GPU snapshots before every in-line
    save (one batched copy, then hashing and torch.save read host memory), and the files are as verified as ever."""
    import dataclasses

    calls: list[int] = []
    real = checkpointer_mod.snapshot_to_host

    def spy(obj):
        calls.append(obj["step"])
        return real(obj)

    monkeypatch.setattr(checkpointer_mod, "snapshot_to_host", spy)
    t = Trainer(toy_config(tmp_path, epochs=2, async_checkpoint=False), task())
    t.checkpointer.rt = dataclasses.replace(t.rt, device=torch.device("cuda"))
    t.fit()
    assert calls == [8, 8, 16, 16]  # last.pt and best.pt after each epoch's validation
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["integrity"] == "verified"
