"""The loop's knobs: precision/scaler, accumulation, clipping, sync rule, resume, checkpoints, samplers."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import trainer.loop as loop_mod
from tests.helpers import cut_short, metric_rows, toy_config
from trainer.checkpoint import CheckpointError, atomic_save, load_checkpoint
from trainer.config import TrainConfig
from trainer.data import ShardedBatchSampler, loader_settings, to_device
from trainer.hooks import HOOK_NAMES, Callback
from trainer.loop import Trainer
from trainer.optim import scaled_lr
from trainer.runtime import Runtime
from trainer.task import Task

N = 256


def make_data(n: int = N, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


def make_task(dropout: float = 0.0, seed: int = 0, val: bool = True) -> Task:
    x, y = make_data()
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 1))
    return Task("toy", model, TensorDataset(x, y), TensorDataset(x[:64], y[:64]) if val else None)


def weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# ---------------------------------------------------------------- config and data plumbing
def test_config_rejects_bad_values_with_the_knob_name():
    with pytest.raises(ValueError, match="precision='fp8'"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="gradient_clip_algorithm"):
        TrainConfig(gradient_clip_algorithm="l2")
    with pytest.raises(ValueError, match="loss_scale"):
        TrainConfig(loss_scale="big")
    with pytest.raises(ValueError, match="unknown setting"):
        TrainConfig.from_dict({"batchsize": 3})


def test_baseline_turns_every_optimisation_off():
    eff = TrainConfig(baseline=True, num_workers=8, precision="bf16-mixed").effective()
    assert (eff.precision, eff.num_workers, eff.pin_memory, eff.persistent_workers) == ("32", 0, False, False)
    assert eff.log_every == 1 and eff.validation_interval == 1 and eff.device_cache is False
    assert TrainConfig().effective().precision == "auto"


def test_loader_settings_correct_invalid_combinations_once():
    kw, notes = loader_settings(
        TrainConfig(num_workers=0, persistent_workers=True, pin_memory=True), torch.device("cpu")
    )
    assert kw == {"num_workers": 0, "pin_memory": False}
    assert any("pin_memory" in n for n in notes) and any("persistent_workers" in n for n in notes)
    kw, _ = loader_settings(
        TrainConfig(num_workers=2, multiprocessing_context="spawn", prefetch_factor=3), torch.device("cpu")
    )
    assert kw["multiprocessing_context"] == "spawn" and kw["prefetch_factor"] == 3 and kw["persistent_workers"]


def test_to_device_handles_nested_batches():
    batch = {"a": torch.ones(2), "b": [torch.zeros(1), (torch.ones(1), "label")], "c": 3}
    out = to_device(batch, torch.device("cpu"))
    assert torch.equal(out["a"], batch["a"]) and out["b"][1][1] == "label" and out["c"] == 3
    assert isinstance(out["b"], list) and isinstance(out["b"][1], tuple)


def test_sharded_sampler_disjoint_equal_and_resumable():
    shards = [[b.tolist() for b in ShardedBatchSampler(103, 10, seed=1, rank=r, world_size=3)] for r in range(3)]
    assert len({len(s) for s in shards}) == 1
    flat = [i for s in shards for b in s for i in b]
    assert len(flat) == len(set(flat))
    s = ShardedBatchSampler(100, 10, seed=1)
    s.set_epoch(3)
    full = [b.tolist() for b in s]
    s.load_state_dict({"epoch": 3, "batches_done": 4})
    assert [b.tolist() for b in s] == full[4:]
    assert [b.tolist() for b in s] == full  # the skip is one-shot
    s.set_epoch(4)
    assert [b.tolist() for b in s] != full
    with pytest.raises(ValueError, match="batch_size=200"):
        ShardedBatchSampler(100, 200)


def test_lr_scaling_rules():
    assert scaled_lr(1e-3, 150, 50, "sqrt") == pytest.approx(1.7320508e-3)
    assert scaled_lr(1e-3, 150, 50, "linear") == pytest.approx(3e-3)
    assert scaled_lr(1e-3, 150, 50, "none") == 1e-3


# ---------------------------------------------------------------- the loop
def test_training_writes_run_directory(tmp_path):
    s = Trainer(toy_config(tmp_path, epochs=3, validation_interval=2), make_task()).fit()
    run = tmp_path / "run"
    rows = metric_rows(run)
    val_rows = [r for r in rows if r["kind"] == "val"]
    assert [r["epoch"] for r in val_rows] == [2, 3]  # every 2nd epoch, and the last one
    assert all(r["loss"] > 0 for r in rows if r["kind"] == "train")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["samples_per_s"] > 0 and 0 <= summary["step_time_s"]["data_wait_frac"] <= 1
    assert "val_loss" in summary["final_metrics"] and summary["skipped_steps"] == 0
    assert {"requested", "effective", "runtime"} <= set(json.loads((run / "config.json").read_text()))
    assert (run / "checkpoints" / "last.pt").is_file() and (run / "checkpoints" / "best.pt").is_file()
    assert s["steps"] == 3 * (N // 32)


def test_max_steps_and_val_check_steps(tmp_path):
    s = Trainer(toy_config(tmp_path, epochs=100, max_steps=11, val_check_steps=5), make_task()).fit()
    assert s["steps"] == 11
    rows = metric_rows(tmp_path / "run")
    assert [r["step"] for r in rows if r["kind"] == "val"] == [5, 10, 11]  # the last step always validates


def test_accumulation_equals_one_large_batch(tmp_path):
    a = Trainer(
        toy_config(tmp_path, run_name="a", batch_size=8, accumulate_grad_batches=4, warmup_steps=2),
        make_task(val=False),
    )
    a.fit()
    b = Trainer(
        toy_config(tmp_path, run_name="b", batch_size=32, accumulate_grad_batches=1, warmup_steps=2),
        make_task(val=False),
    )
    b.fit()
    assert a.step == b.step == 2 * (N // 32)
    for p, q in zip(weights(a.raw_model), weights(b.raw_model)):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", ["norm", "value"])
def test_clipping_bounds_the_update(tmp_path, algo):
    t = Trainer(
        toy_config(tmp_path, gradient_clip_val=1e-3, gradient_clip_algorithm=algo, max_steps=1, warmup_steps=0),
        make_task(val=False),
    )
    batch = next(iter(t.data.loader))
    t.forward_backward(batch, 1)
    grads_before = [p.grad.clone() for p in t.opt.params]
    norm, found = t.opt.step(want_norm=True)
    assert float(found) == 0
    assert max(g.abs().max() for g in grads_before) > 1e-3  # clipping had something to do
    if algo == "norm":
        assert norm is not None and float(norm) > 1e-3


def test_fp16_scaler_skips_step_and_schedule_on_inf(tmp_path, monkeypatch):
    """fp16 with a GradScaler: an inf gradient skips optimizer.step() and the schedule does not advance."""
    monkeypatch.setattr(
        loop_mod, "resolve_runtime", lambda *a, **k: Runtime(torch.device("cpu"), "16-mixed", torch.float16)
    )
    t = Trainer(toy_config(tmp_path, warmup_steps=10, gradient_clip_val=1.0), make_task(val=False))
    assert t.opt.fp16
    # a scale at which this toy's fp16 backward does not overflow by itself
    t.opt.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    batch = next(iter(t.data.loader))
    before = weights(t.raw_model)
    lr0 = t.optim.schedule.current_lr()
    scale0 = t.opt.scaler.get_scale()
    t.forward_backward(batch, 1)
    t.opt.params[0].grad[0, 0] = float("inf")  # the fake overflow
    t.opt.step(want_norm=False)
    assert all(torch.equal(p, q) for p, q in zip(before, weights(t.raw_model)))
    assert t.optim.schedule.steps == 0 and t.optim.schedule.current_lr() == lr0
    assert t.opt.scaler.get_scale() == scale0 / 2
    assert t.opt.skip_counts() == (1, 1)
    t.forward_backward(batch, 1)
    t.opt.step(want_norm=False)
    assert t.opt.skip_counts() == (1, 0)
    assert t.optim.schedule.steps == 1 and t.optim.schedule.current_lr() > lr0
    assert not all(torch.equal(p, q) for p, q in zip(before, weights(t.raw_model)))


def test_static_loss_scale_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(
        loop_mod, "resolve_runtime", lambda *a, **k: Runtime(torch.device("cpu"), "16-mixed", torch.float16)
    )
    t = Trainer(toy_config(tmp_path, loss_scale=256.0, max_steps=3), make_task(val=False))
    batch = next(iter(t.data.loader))
    t.forward_backward(batch, 1)
    t.opt.params[0].grad[0, 0] = float("nan")
    t.opt.step(want_norm=False)
    assert t.opt.scaler.get_scale() == 256.0


class SyncCounter:
    """Counts host-device syncs (item, cpu, tolist, float(), bool()) made from project code."""

    ROOT = str(Path(__file__).resolve().parents[1])

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__"):
            orig = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(orig, name))

    def _wrap(self, orig, name):
        import sys

        counter = self

        def wrapper(t, *a, **k):
            f = sys._getframe(1)
            fn = f.f_code.co_filename
            # the checkpoint digest hashes host tensors through numpy(): no device read (the leaf's
            # support/checkpoint_file.py copies device tensors to the host first, its marked sync point)
            host_hash = name == "numpy" and fn.endswith("trainer/support/checkpoint_file.py") and t.device.type == "cpu"
            if fn.startswith(counter.ROOT) and "/tests/" not in fn and "/.venv/" not in fn and not host_hash:
                counter.calls.append(f"{name} {os.path.relpath(fn, counter.ROOT)}:{f.f_lineno}")
            return orig(t, *a, **k)

        return wrapper


@pytest.mark.parametrize("hooks", [False, True])
def test_sync_rule_only_at_log_points(tmp_path, monkeypatch, hooks):
    """200 steps with log_every 50: at most a handful of host syncs per log point, none in between.

    plainloop's AdamW is fused, so the non-finite guard decides on the device (trainer/step.py step_unless);
    host_reads=False walks the GPU path, where nobody reads the flag back. With every hook installed (the
    do-nothing `Callback`), the engine's hook calls add no sync either."""
    x, y = make_data(200 * 8)
    torch.manual_seed(0)
    task = Task("toy", nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)), TensorDataset(x, y))
    t = Trainer(
        toy_config(
            tmp_path,
            epochs=1,
            batch_size=8,
            log_every=50,
            norm_every=100,
            gradient_clip_val=1.0,
            validation_interval=100,
        ),
        task,
        callbacks=[Callback()] if hooks else None,
    )
    t.opt.host_reads = False  # walk the GPU path: the flag stays on the device
    counter = SyncCounter(monkeypatch)
    t.fit()
    assert t.step == 200
    if hooks:  # every hook was resolved and called (the per-batch ones per batch)
        assert all(len(t.hooks.bound[n]) == 1 for n in HOOK_NAMES) and t.opt.before_step is not None
    log_points = 200 // 50
    # the counter sees the loss read-backs (one tolist per log point, the skip counters riding along)
    assert sum(c.startswith("tolist trainer/loop.py") for c in counter.calls) == log_points
    assert len(counter.calls) <= 3 * log_points, counter.calls


def test_guard_reads_the_flag_on_the_host_once_per_step_on_a_cpu(tmp_path, monkeypatch):
    """On a CPU the guard's flag is read once per step (free: no device to wait for), nothing else."""
    x, y = make_data(40 * 8)
    torch.manual_seed(0)
    task = Task("toy", nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)), TensorDataset(x, y))
    t = Trainer(toy_config(tmp_path, epochs=1, batch_size=8, log_every=20, validation_interval=100), task)
    counter = SyncCounter(monkeypatch)
    t.fit()
    per_step = [c for c in counter.calls if c.startswith("item trainer/step.py")]
    assert len(per_step) == 40
    assert len(counter.calls) - len(per_step) <= 3 * 2, counter.calls


# ---------------------------------------------------------------- checkpoints and resume
@pytest.mark.parametrize("workers", [0, 1])
def test_resume_is_exact(tmp_path, workers):
    """4 epochs straight == 2 epochs + resume + 2 epochs, bit for bit (dropout RNG included)."""
    # workers=1 keeps the data in a DataLoader (device_cache off): both data paths must resume exactly
    dc = False if workers else None
    straight = Trainer(
        toy_config(tmp_path, run_name="straight", epochs=4, num_workers=workers, device_cache=dc),
        make_task(dropout=0.2),
    )
    straight.fit()
    first = Trainer(
        toy_config(tmp_path, run_name="split", epochs=4, num_workers=workers, device_cache=dc),
        make_task(dropout=0.2),
    )
    cut_short(first, max_epochs=2)  # the job is interrupted after epoch 2
    first.fit()
    second = Trainer(
        toy_config(
            tmp_path,
            run_name="split",
            epochs=4,
            num_workers=workers,
            device_cache=dc,
            resume=str(tmp_path / "split"),
        ),
        make_task(dropout=0.2, seed=123),
    )
    second.fit()
    assert second.step == straight.step
    for p, q in zip(weights(straight.raw_model), weights(second.raw_model)):
        assert torch.equal(p, q)


def test_resume_mid_epoch_is_exact(tmp_path):
    straight = Trainer(toy_config(tmp_path, run_name="s", epochs=2), make_task(dropout=0.1))
    straight.fit()
    part = Trainer(toy_config(tmp_path, run_name="p", epochs=2, checkpoint_every=5), make_task(dropout=0.1))
    cut_short(part, total_steps=11)  # interrupted mid-epoch 2 (8 steps per epoch); last.pt written at the stop
    part.fit()
    ck = load_checkpoint(tmp_path / "p" / "checkpoints" / "last.pt")
    assert ck["step"] == 11 and ck["batches_done"] == 3 and ck["epoch"] == 1
    rest = Trainer(
        toy_config(tmp_path, run_name="p", epochs=2, resume=str(tmp_path / "p")), make_task(dropout=0.1, seed=9)
    )
    rest.fit()
    for p, q in zip(weights(straight.raw_model), weights(rest.raw_model)):
        assert torch.equal(p, q)


def test_epochs_are_counted_alike_mid_epoch_and_at_resume(tmp_path, capsys):
    """Stopped inside epoch 2 the epoch line, and the resume, both say epoch 2 (not 1: one epoch finished)."""
    part = Trainer(toy_config(tmp_path, run_name="p", epochs=2, log_every=100), make_task())
    cut_short(part, total_steps=11)  # 8 steps per epoch: stopped after batch 3 of epoch 2
    part.fit()
    out = capsys.readouterr().out
    assert "[epoch 1/2] step 8/11" in out and "[epoch 2/2] step 11/11" in out
    rest = Trainer(toy_config(tmp_path, run_name="p", epochs=2, resume=str(tmp_path / "p")), make_task())
    assert any(n.endswith("at step 11 (epoch 2, batch 3 of 8)") for n in rest.notes), rest.notes
    done = Trainer(toy_config(tmp_path, run_name="q", epochs=1), make_task())
    done.fit()
    again = Trainer(toy_config(tmp_path, run_name="q", epochs=2, resume=str(tmp_path / "q")), make_task())
    assert any(n.endswith("at step 8 (end of epoch 1)") for n in again.notes), again.notes


def test_resume_after_a_kill_keeps_one_row_per_step(tmp_path):
    """kill -9 after log rows past the last checkpoint: the resume trains those steps again, so their old rows
    (and a line torn by the kill) move to metrics.rolled_back.jsonl instead of appearing twice."""
    Trainer(toy_config(tmp_path, epochs=1, log_every=2), make_task()).fit()  # rows at steps 2, 4, 6, 8; last.pt at 8
    run = tmp_path / "run"
    ck = load_checkpoint(run / "checkpoints" / "last.pt")
    ck["step"], ck["epoch"], ck["batches_done"] = 4, 0, 4  # as if killed after step 6, the last save at 4
    ck.pop("digest", None)
    atomic_save(ck, run / "checkpoints" / "last.pt")
    (run / "summary.json").unlink()
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"kind": "train", "step": 7, "lo')  # torn by the kill
    rest = Trainer(toy_config(tmp_path, epochs=1, log_every=2, resume=str(run)), make_task())
    rest.fit()
    rows = metric_rows(run)
    steps = [r["step"] for r in rows if r["kind"] == "train"]
    assert steps == [2, 4, 6, 8], steps
    moved = (run / "metrics.rolled_back.jsonl").read_text().splitlines()
    assert len(moved) == 4 and '"step": 7, "lo' in moved[-1]  # steps 6 and 8, the val row at 8, the torn line
    assert any("4 metrics row(s) written after the checkpoint's step 4" in n for n in rest.notes)


class Killed(BaseException):
    """Stands for kill -9 inside validation: nothing after it runs, no handler catches it."""


@pytest.mark.parametrize("kill_at", [2, 3])  # the 2nd of 3 validations (step 16), or the last one (step 24)
def test_a_run_killed_during_validation_redoes_what_followed_the_last_save(tmp_path, kill_at):
    """last.pt is written after an epoch's validation; killed inside a validation, the resume starts from the save
    before it and redoes that epoch and its validation, so every step still has one val row, best.pt sees every
    candidate, and the result is the uninterrupted run's."""
    straight = Trainer(toy_config(tmp_path, run_name="s", epochs=3), make_task(dropout=0.2))
    done = straight.fit()
    part = Trainer(toy_config(tmp_path, run_name="p", epochs=3), make_task(dropout=0.2))
    real, calls = part.evaluate, []

    def dies_inside(split):
        calls.append(split)
        if len(calls) == kill_at:
            raise Killed
        return real(split)

    part.evaluate = dies_inside
    with pytest.raises(Killed):
        part.fit()
    part.run.files.close()  # the killed process's lock goes with it
    ck = load_checkpoint(tmp_path / "p" / "checkpoints" / "last.pt")
    assert ck["step"] == 8 * (kill_at - 1) and ck["val_pending"] is None and ck["ended"] is None
    rest = Trainer(
        toy_config(tmp_path, run_name="p", epochs=3, resume=str(tmp_path / "p")), make_task(dropout=0.2, seed=5)
    )
    summary = rest.fit()

    def vals(run):
        rows = metric_rows(tmp_path / run)
        return [(r["step"], r["val_loss"]) for r in rows if r["kind"] == "val"]

    assert vals("p") == vals("s") and [s for s, _ in vals("p")] == [8, 16, 24]  # one row per validation
    assert summary["final_metrics"] == done["final_metrics"]
    for p, q in zip(weights(straight.raw_model), weights(rest.raw_model)):
        assert torch.equal(p, q)
    best = [json.loads((tmp_path / r / "best.json").read_text()) for r in ("s", "p")]
    assert best[0]["value"] == best[1]["value"] and best[0]["step"] == best[1]["step"]
    end = load_checkpoint(tmp_path / "s" / "checkpoints" / "last.pt")
    assert end["step"] == 24 and end["val_pending"] is None and end["ended"] == "finished"  # written after val


def test_a_stop_signal_during_validation_finishes_it_and_rewrites_last_pt(tmp_path):
    """SIGTERM inside validation: the validation finishes (its row, best.pt), last.pt is written again without
    the pending mark, and the resume does not validate that step a second time."""
    import signal

    from trainer.finish import TrainingStopped

    part = Trainer(toy_config(tmp_path, run_name="p", epochs=3), make_task())
    real = part.evaluate

    def signalled(split):
        if part.step == 16:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the flag
        return real(split)

    part.evaluate = signalled
    with pytest.raises(TrainingStopped):
        part.fit()
    ck = load_checkpoint(tmp_path / "p" / "checkpoints" / "last.pt")
    assert ck["step"] == 16 and ck["val_pending"] is None
    rest = Trainer(toy_config(tmp_path, run_name="p", epochs=3, resume=str(tmp_path / "p")), make_task())
    rest.fit()
    rows = metric_rows(tmp_path / "p")
    assert [r["step"] for r in rows if r["kind"] == "val"] == [8, 16, 24]


def test_a_stop_signal_at_an_epoch_end_leaves_that_validation_to_the_resume(tmp_path):
    """SIGTERM during an epoch's last batch: the run stops before validating, last.pt says the validation is
    pending, and the resume runs it first: no epoch goes without its val row."""
    import signal

    from trainer.finish import TrainingStopped

    part = Trainer(toy_config(tmp_path, run_name="p", epochs=3), make_task())
    real, batches = part.forward_backward, []

    def signalled(*a, **k):
        batches.append(1)
        if len(batches) == 16:  # the last batch of epoch 2
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the flag
        return real(*a, **k)

    part.forward_backward = signalled
    with pytest.raises(TrainingStopped):
        part.fit()
    ck = load_checkpoint(tmp_path / "p" / "checkpoints" / "last.pt")
    assert ck["step"] == ck["val_pending"] == 16
    Trainer(toy_config(tmp_path, run_name="p", epochs=3, resume=str(tmp_path / "p")), make_task()).fit()
    rows = [json.loads(line) for line in (tmp_path / "p" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "val"] == [8, 16, 24]


def test_a_run_killed_after_its_last_step_validation_does_not_validate_it_again(tmp_path, monkeypatch):
    """val_check_steps divides the last step: its validation ran before last.pt, so a resume of a run killed
    afterwards (e.g. while testing) goes straight to the test scores and summary, with one val row per step."""
    import trainer.loop

    part = Trainer(toy_config(tmp_path, run_name="p", epochs=3, val_check_steps=8), make_task())
    with monkeypatch.context() as m:
        m.setattr(trainer.loop.Trainer, "_test", lambda t: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            part.fit()
    assert load_checkpoint(tmp_path / "p" / "checkpoints" / "last.pt")["last_val_step"] == 24
    rest = Trainer(
        toy_config(tmp_path, run_name="p", epochs=3, val_check_steps=8, resume=str(tmp_path / "p")), make_task()
    )
    rest.fit()
    rows = [json.loads(line) for line in (tmp_path / "p" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "val"] == [8, 16, 24]


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pickled_checkpoint_is_refused(tmp_path):
    bad = tmp_path / "bad.pt"
    torch.save({"model": {}, "payload": Evil()}, bad)
    with pytest.raises(CheckpointError, match="weights_only=True"):
        load_checkpoint(bad)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    trunc = tmp_path / "trunc.pt"
    atomic_save({"model": {"w": torch.ones(1000)}}, trunc)
    trunc.write_bytes(trunc.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(trunc)


def test_atomic_save_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "ck.pt"
    atomic_save({"model": {"w": torch.ones(2)}}, target)

    def boom(*a, **k):
        raise pickle.PicklingError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(pickle.PicklingError):
        atomic_save({"model": {}}, target)
    assert torch.equal(load_checkpoint(target)["model"]["w"], torch.ones(2))  # old file intact
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]


def test_progress_bar_moves_every_epoch_even_when_epochs_are_short(tmp_path, monkeypatch, capsys):
    """8 batches per epoch with progress_every 10: one run-level bar still advances at every epoch end."""
    import trainer.console as progress

    seen: list[tuple[int, dict]] = []

    class FakeBar:  # always drawn (a real bar would turn itself off here: pytest's stderr is not a terminal)
        def __init__(self, total, initial=0, **kw):
            self.total, self.n, self.postfix = total, initial, {}
            assert kw["disable"] is None  # tqdm decides: on for a terminal, off when piped

        def update(self, k):
            self.n += k
            seen.append((self.n, dict(self.postfix)))

        def set_postfix(self, refresh=False, **kw):
            self.postfix = kw

        def write(self, s):
            print(s)

        def close(self):
            pass

    monkeypatch.setattr(progress, "tqdm", FakeBar)
    t = Trainer(toy_config(tmp_path, epochs=3, progress_bar=True, progress_every=10, log_every=100), make_task())
    t.fit()
    assert [n for n, _ in seen] == [8, 16, 24]  # once per 8-batch epoch, never stuck at 0
    assert all("loss" in post and "sps" in post for _, post in seen)  # the last logged figures stay on it
    out = capsys.readouterr().out
    assert out.count("[epoch ") == 3 and "ETA" in out and out.count("[val]") == 3  # validation_interval 1


def test_progress_bar_turns_itself_off_when_stderr_is_not_a_terminal(tmp_path, capsys):
    """Piped to a file (here: captured), the bar's redraws would interleave with the epoch lines: no bar at all."""
    pytest.importorskip("tqdm")
    t = Trainer(toy_config(tmp_path, epochs=2, progress_bar=True, progress_every=1, log_every=100), make_task())
    t.fit()
    cap = capsys.readouterr()
    assert "batch/s" not in cap.err and "train:" not in cap.err and "\r" not in cap.err + cap.out
    assert cap.out.count("[epoch ") == 2  # the lines still come, printed (no bar is made)


def test_trainer_seeds_the_loop_not_a_model_built_before_it(tmp_path):
    """What the manual's getting-started page says: the Trainer leaves a given model's weights as they are, and
    every code block of the README and docs/ that hands its own model to Task seeds torch before building it."""
    import re

    task = make_task(seed=123)
    before = weights(task.model)
    t = Trainer(toy_config(tmp_path, run_name="s", seed=7, max_steps=1), task)
    assert all(torch.equal(w, v) for w, v in zip(weights(t.model), before))  # taken as built, not re-initialised
    root = Path(__file__).resolve().parents[1]
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    blocks = [b for p in pages for b in re.findall(r"```python\n(.*?)```", p.read_text(encoding="utf-8"), re.S)]
    built = 0
    for b in blocks:
        m = re.search(r"Task\(\"[^\"]*\", (\w+)(\(\))?", b)
        assigned = m and re.search(rf"^{m.group(1)} = ", b, re.M)
        if not m or not (m.group(2) or assigned):
            continue  # no model handed to Task here, or one built outside this block
        made = m.start() if m.group(2) else assigned.start()
        seeded = re.search(r"manual_seed\(|seed_everything\(", b)
        assert seeded and seeded.start() < made, b
        built += 1
    assert built >= 2, "the docs show no own model through Task"
    guide = (root / "docs" / "tutorials" / "getting-started.md").read_text(encoding="utf-8")
    assert "Trainer` seeds the loop only" in guide and "torch.manual_seed(seed)" in guide


def test_cpu_precision_auto_is_fp32_and_bf16_is_honoured():
    from trainer.runtime import resolve_runtime

    auto = resolve_runtime("auto", "cpu")
    assert (auto.precision, auto.amp_dtype) == ("32", None)
    bf16 = resolve_runtime("bf16-mixed", "cpu")
    assert (bf16.precision, bf16.amp_dtype, bf16.notes) == ("bf16-mixed", torch.bfloat16, [])
    with bf16.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    fp16 = resolve_runtime("16-mixed", "cpu")
    assert fp16.precision == "32" and "16-mixed needs a CUDA GPU" in fp16.notes[0]


def test_a_log_callable_gets_every_line_also_with_the_bar_on(tmp_path, capsys):
    lines: list[str] = []
    Trainer(toy_config(tmp_path, progress_bar=True), make_task(), log=lines.append).fit()
    assert any(line.startswith("[epoch 2/2]") for line in lines)
    out = capsys.readouterr()
    assert "[epoch" not in out.out + out.err  # nothing went around the caller's log


def test_fit_runs_once_and_a_second_call_says_how_to_train_on(tmp_path):
    """A second fit() on the same Trainer used to print the start-up again, train nothing and return the old summary."""
    t = Trainer(toy_config(tmp_path, epochs=1), make_task(), log=lambda _m: None)
    t.fit()
    with pytest.raises(RuntimeError, match="runs once") as e:
        t.fit()
    assert f"resume={str(t.run_dir)!r}" in str(e.value)


def test_an_epoch_line_before_the_first_log_point_makes_up_no_loss():
    """Stopped before any loss was read, the line said "loss nan, 0 samples/s", which reads as a divergence."""
    from trainer.console import epoch_line

    line = epoch_line(epoch=1, max_epochs=1, step=45, total_steps=120, row={}, eta_s=3.0, saved="last.pt saved")
    assert "no loss logged yet" in line and "nan" not in line and line.endswith("last.pt saved")
    line = epoch_line(epoch=1, max_epochs=1, step=100, total_steps=120, row={"loss": 0.5}, eta_s=3.0)
    assert "loss 0.5," in line


def test_an_epoch_line_after_a_stop_between_log_points_says_which_step_its_loss_is_from():
    """A stop mid-epoch shows the last logged loss, maybe the previous epoch's: the line names its step."""
    from trainer.console import epoch_line

    row = {"loss": 3.293, "step": 80, "samples_per_s": 10.0}
    line = epoch_line(epoch=3, max_epochs=3, step=83, total_steps=120, row=row, eta_s=3.0)
    assert "loss 3.293 (at step 80)," in line
    assert "(at step" not in epoch_line(epoch=3, max_epochs=3, step=80, total_steps=120, row=row, eta_s=3.0)


def test_a_map_style_dataset_gets_python_int_indices_as_under_dataloader(tmp_path):
    """torch's samplers hand __getitem__ an int; a numpy int64 broke torch.Generator().manual_seed(i)."""
    from torch.utils.data import Dataset

    from trainer import Task, Trainer

    seen: set[type] = set()

    class Seeded(Dataset):
        def __len__(self) -> int:
            return 32

        def __getitem__(self, i):
            seen.add(type(i))
            g = torch.Generator().manual_seed(i)  # needs an int
            return torch.randn(4, generator=g), torch.randn(1, generator=g)

    Trainer(toy_config(tmp_path, epochs=1, batch_size=8), Task("t", torch.nn.Linear(4, 1), Seeded(), Seeded())).fit()
    assert seen == {int}


def test_best_json_counts_epochs_as_the_val_rows_and_files_do(tmp_path):
    """A validation mid-epoch (val_check_steps) is in epoch 1 for the val row, the top-k file and best.json alike."""
    from trainer import Task, Trainer
    from trainer.state import Progress

    assert Progress(epoch=0, batches_done=3).epoch_number == 1 and Progress(epoch=2).epoch_number == 2
    x = torch.randn(64, 4)
    ds = TensorDataset(x, x.sum(1, keepdim=True))
    cfg = toy_config(tmp_path, epochs=1, batch_size=8, val_check_steps=4)
    summary = Trainer(cfg, Task("t", nn.Linear(4, 1), ds, ds)).fit()
    best = json.loads((Path(summary["run_dir"]) / "best.json").read_text())
    rows = {r["step"]: r["epoch"] for r in metric_rows(Path(summary["run_dir"])) if r["kind"] == "val"}
    assert best["epoch"] == rows[best["step"]] == 1


def test_early_stopping_acts_at_a_step_validation_not_at_the_epochs_end(tmp_path):
    """val_check_steps with patience 1 in one long epoch: the run stops at the first validation that does not
    improve (it trained the whole epoch on, and a stream, one epoch, never stopped early)."""
    from trainer import Callback, Task, Trainer

    class Worse(Callback):  # each validation scores worse than the one before
        n = 0

        def on_validation_end(self, trainer, metrics):
            Worse.n += 1
            metrics["val_loss"] = float(Worse.n)

    lines: list[str] = []
    x = torch.randn(256, 4)
    ds = TensorDataset(x, x.sum(1, keepdim=True))
    cfg = toy_config(tmp_path, epochs=1, batch_size=4, val_check_steps=4, early_stopping_patience=1)
    summary = Trainer(cfg, Task("t", nn.Linear(4, 1), ds, ds), callbacks=[Worse()], log=lines.append).fit()
    assert summary["steps"] == 8 and Worse.n == 2
    assert sum("early stopping" in line for line in lines) == 1
    assert [r["step"] for r in metric_rows(Path(summary["run_dir"])) if r["kind"] == "val"] == [4, 8]
