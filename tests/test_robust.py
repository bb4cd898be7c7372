"""Never lose a run (engine level): the non-finite guard, stop signals, run directories, OOM, early stopping."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from tests.helpers import metric_rows, toy_config
from trainer import Task, Trainer
from trainer.checkpoint import load_checkpoint
from trainer.finish import TrainingDiverged, TrainingStopped
from trainer.runfiles import RunDirError, RunLock
from trainer.state import ResumeError
from trainer.step import OptimizerStep, nonfinite_flag, step_unless

N = 256


def data(n: int = N, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, x @ torch.randn(8, 1, generator=g)


def toy(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 1))


def finite_state(path: Path) -> bool:
    return all(torch.isfinite(v).all() for v in load_checkpoint(path)["model"].values())


# ---------------------------------------------------------------- the non-finite guard
def test_nonfinite_flag_and_skip_on_a_fused_optimizer():
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)  # the fused kernel takes the flag: no host read
    found = torch.zeros(())
    p.grad = torch.tensor([1.0, float("nan"), 1.0])
    assert float(nonfinite_flag([p.grad], found)) == 1.0
    assert step_unless(opt, found) is None and torch.equal(p.detach(), torch.ones(3))  # skipped on the device
    p.grad = torch.ones(3)
    found.zero_()
    step_unless(opt, nonfinite_flag([p.grad], found))
    assert not torch.equal(p.detach(), torch.ones(3))


class NaNBatch(Dataset):
    """(x, y) pairs where the samples of one index range hold a NaN input: one batch goes bad."""

    def __init__(self, bad: range) -> None:
        self.x, self.y = data()
        self.x[bad.start : bad.stop, 0] = float("nan")

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def test_a_nan_batch_is_skipped_counted_and_never_saved(tmp_path):
    t = Trainer(toy_config(tmp_path, epochs=1), Task("toy", toy(), NaNBatch(range(0, 1)), TensorDataset(*data(64))))
    s = t.fit()
    assert s["skipped_steps"] == 1 and s["steps"] == N // 32
    train_rows = [r for r in metric_rows(t.run_dir) if r["kind"] == "train"]
    assert train_rows[-1]["skipped_steps"] == 1
    assert all(torch.isfinite(p).all() for p in t.raw_model.parameters())
    assert finite_state(t.run_dir / "checkpoints" / "last.pt")


class NaNModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * float("nan")


def test_a_model_that_always_gives_nan_stops_with_exit_code_3(tmp_path, capsys):
    t = Trainer(
        toy_config(tmp_path, epochs=50, max_consecutive_skips=5), Task("toy", NaNModel(), TensorDataset(*data()))
    )
    with pytest.raises(TrainingDiverged) as e:
        t.fit()
    assert e.value.code == 3
    out = capsys.readouterr().out
    assert "non-finite" in out and "--lr" in out and f"step {t.step}" in out
    assert t.step <= 8  # noticed at the first log point after 5 skips
    events = [r for r in metric_rows(t.run_dir) if r["kind"] == "event"]
    assert events and events[0]["event"] == "diverged"
    assert all(torch.isfinite(p).all() for p in t.raw_model.parameters())


def test_huge_lr_never_writes_nonfinite_weights(tmp_path):
    t = Trainer(
        toy_config(tmp_path, epochs=20, lr=1e3, warmup_steps=0, max_consecutive_skips=3),
        Task("toy", toy(), TensorDataset(*data())),
    )
    try:
        t.fit()
    except TrainingDiverged:
        pass
    for name in ("last.pt", "best.pt"):
        f = t.run_dir / "checkpoints" / name
        assert not f.exists() or finite_state(f)


# ---------------------------------------------------------------- stop signals
class SignalAt:
    """A callback that sends this process a signal when the run logs step `step`."""

    def __init__(self, step: int, sig: int = signal.SIGTERM) -> None:
        self.step, self.sig = step, sig

    def on_log(self, trainer, row) -> None:
        if row.get("kind") == "train" and row["step"] == self.step:
            os.kill(os.getpid(), self.sig)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_signal_finishes_the_step_saves_and_resumes_exactly(tmp_path, sig, capsys):
    straight = Trainer(
        toy_config(tmp_path, run_name="s", epochs=2, log_every=1),
        Task("toy", toy(dropout=0.2), TensorDataset(*data())),
    )
    straight.fit()
    t = Trainer(
        toy_config(tmp_path, run_name="p", epochs=2, log_every=1),
        Task("toy", toy(dropout=0.2), TensorDataset(*data())),
        callbacks=[SignalAt(5, sig)],
    )
    with pytest.raises(TrainingStopped) as e:
        t.fit()
    assert e.value.code == 128 + sig
    out = capsys.readouterr().out
    assert f"resume='{t.run_dir}'" in out  # in-process (no train_optimized.py): the Python call to resume
    ck = load_checkpoint(t.run_dir / "checkpoints" / "last.pt")
    assert ck["step"] == 5 and ck["batches_done"] == 5  # mid-epoch: exact resume from batch 5
    assert json.loads((t.run_dir / "summary.json").read_text())["stopped_by"] == signal.Signals(sig).name
    rest = Trainer(
        toy_config(tmp_path, run_name="p", epochs=2, log_every=1, resume=str(t.run_dir)),
        Task("toy", toy(seed=7, dropout=0.2), TensorDataset(*data())),
    )
    rest.fit()
    for p, q in zip(straight.raw_model.parameters(), rest.raw_model.parameters()):
        assert torch.equal(p, q)


# ---------------------------------------------------------------- run directories
def test_a_reused_run_name_never_overwrites_a_finished_run(tmp_path):
    first = Trainer(toy_config(tmp_path, epochs=1), Task("toy", toy(), TensorDataset(*data())))
    first.fit()
    before = (
        (first.run_dir / "summary.json").read_bytes(),
        (first.run_dir / "checkpoints" / "last.pt").read_bytes(),
    )
    second = Trainer(toy_config(tmp_path, epochs=1, seed=3), Task("toy", toy(1), TensorDataset(*data())))
    second.fit()
    assert second.run_dir == tmp_path / "run-2"
    assert any("already holds a run" in n for n in second.notes)
    after = (
        (first.run_dir / "summary.json").read_bytes(),
        (first.run_dir / "checkpoints" / "last.pt").read_bytes(),
    )
    assert before == after


def test_a_second_live_process_on_one_run_dir_is_refused(tmp_path):
    lock = RunLock(tmp_path)
    with pytest.raises(RunDirError, match=f"another live process \\(pid {os.getpid()}\\)"):
        RunLock(tmp_path)
    lock.release()
    RunLock(tmp_path).release()  # free again once released


def test_default_names_are_unique(tmp_path):
    runs = [
        Trainer(toy_config(tmp_path, epochs=1, run_name=None), Task("toy", toy(), TensorDataset(*data(64))))
        for _ in range(3)
    ]
    for t in runs:
        t.fit()
    assert len({t.run_dir for t in runs}) == 3


@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("how", ["finished", "raised"])
def test_loader_workers_ignore_stop_signals_and_end_with_fit(tmp_path, persistent, how):
    """Loader workers ignore stop signals (torchrun and SLURM signal them too, and one that died crashed its rank), so
    fit() must end them itself: left to interpreter exit, multiprocessing's SIGTERM no longer did and exit hung."""
    import multiprocessing

    calls = []

    def loss(model, batch):
        calls.append(1)
        if how == "raised" and len(calls) == 3:
            raise KeyboardInterrupt  # a second Ctrl-C mid-epoch
        return nn.functional.mse_loss(model(batch[0]), batch[1])

    cfg = toy_config(tmp_path, epochs=1, num_workers=1, device_cache=False, persistent_workers=persistent)
    t = Trainer(cfg, Task("toy", toy(), TensorDataset(*data()), loss_fn=loss))
    assert t.data.loader.worker_init_fn is not None
    with pytest.raises(KeyboardInterrupt) if how == "raised" else contextlib.nullcontext():
        t.fit()
    assert multiprocessing.active_children() == []


def test_ignore_stop_signals_ignores_every_stop_signal():
    from trainer.signals import STOP_SIGNALS, ignore_stop_signals

    old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        ignore_stop_signals(0)
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in STOP_SIGNALS)
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: this test process goes on
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ---------------------------------------------------------------- resume checks
def test_resume_with_other_model_sizes_is_a_clear_error(tmp_path):
    Trainer(toy_config(tmp_path, epochs=1), Task("toy", toy(), TensorDataset(*data()))).fit()
    wide = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    with pytest.raises(ResumeError, match="do not fit this model.*size mismatch"):
        Trainer(toy_config(tmp_path, epochs=2, resume=str(tmp_path / "run")), Task("toy", wide, TensorDataset(*data())))


def test_extending_epochs_notes_how_the_schedule_continues(tmp_path):
    Trainer(toy_config(tmp_path, epochs=1), Task("toy", toy(), TensorDataset(*data()))).fit()
    t = Trainer(
        toy_config(tmp_path, epochs=3, resume=str(tmp_path / "run")), Task("toy", toy(), TensorDataset(*data()))
    )
    assert any("now has 24 optimizer steps (was 8)" in n for n in t.notes)
    with pytest.raises(ResumeError, match="nothing is left to do"):
        Trainer(
            toy_config(tmp_path, epochs=1, resume=str(tmp_path / "run")), Task("toy", toy(), TensorDataset(*data()))
        )


def test_a_run_stopped_while_scoring_the_test_split_finishes_on_resume(tmp_path):
    """Training complete, test scoring interrupted (a kill there leaves last.pt at the last step and no summary):
    --resume RUN_DIR scores the test split and writes the summary instead of saying there is nothing to train."""
    ds = TensorDataset(*data())
    calls = []

    def make_task(fail: bool) -> Task:
        def evaluate(model, split, device):
            calls.append(split)
            if fail and split == "test":
                raise KeyboardInterrupt  # stands in for the kill
            x, y = ds.tensors
            return {f"{split}_mse": float(((model(x.to(device)) - y.to(device)) ** 2).mean())}

        return Task("toy", toy(), ds, test_set=ds, evaluate_fn=evaluate)  # no val set: nothing pending but the test

    ref = Trainer(toy_config(tmp_path, run_name="ref"), make_task(False)).fit()
    with pytest.raises(KeyboardInterrupt):
        Trainer(toy_config(tmp_path, run_name="cut"), make_task(True)).fit()
    assert not (tmp_path / "cut" / "summary.json").exists()
    t = Trainer(toy_config(tmp_path, resume=str(tmp_path / "cut")), make_task(False))
    assert any("training had ended" in n for n in t.notes)
    done = t.fit()
    assert done["final_metrics"] == ref["final_metrics"] and done["steps"] == ref["steps"] == 16
    assert calls.count("test") == 3  # the reference, the interrupted one, the resumed one
    with pytest.raises(ResumeError, match="nothing is left to do"):  # now it has finished
        Trainer(toy_config(tmp_path, resume=str(tmp_path / "cut")), make_task(False))


def test_a_finished_run_with_a_validation_is_not_trained_or_scored_again(tmp_path):
    """last.pt is written right before the final validation (val_pending): a resume of the finished run ran that
    validation and the test split again and overwrote summary.json (its time, speed and verdict) with a 0-step one."""
    ds = TensorDataset(*data())
    Trainer(toy_config(tmp_path, epochs=1), Task("toy", toy(), ds, val_set=ds, test_set=ds)).fit()
    summary = (tmp_path / "run" / "summary.json").read_bytes()
    with pytest.raises(ResumeError, match="nothing is left to do"):
        Trainer(toy_config(tmp_path, epochs=1, resume=str(tmp_path / "run")), Task("toy", toy(), ds, val_set=ds))
    assert (tmp_path / "run" / "summary.json").read_bytes() == summary


# ---------------------------------------------------------------- out of memory, early stopping, batch counts
class OOMAbove(nn.Sequential):
    """Raises CUDA's out-of-memory error for micro-batches larger than `limit` (an injected OOM)."""

    limit = 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return super().forward(x)


def test_out_of_memory_halves_the_micro_batch_and_keeps_the_effective_batch(tmp_path):
    ref = Trainer(toy_config(tmp_path, run_name="ref", epochs=1), Task("toy", toy(), TensorDataset(*data())))
    ref.fit()
    torch.manual_seed(0)
    m = OOMAbove(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.0), nn.Linear(32, 1))
    t = Trainer(toy_config(tmp_path, run_name="oom", epochs=1), Task("toy", m, TensorDataset(*data())))
    s = t.fit()
    assert t.run.chunks == 4 and s["steps"] == ref.step
    assert any("micro-batch 16 -> 8" in n and "effective batch unchanged" in n for n in s["notes"])
    for p, q in zip(ref.raw_model.parameters(), t.raw_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_early_stopping_and_testing_with_the_best_weights(tmp_path):
    x, y = data()
    t = Trainer(
        toy_config(tmp_path, epochs=40, lr=3e-2, early_stopping_patience=2, test_with_best=True),
        Task(
            "toy",
            toy(),
            TensorDataset(x, y),
            TensorDataset(x[:64], y[:64] + 5.0),
            TensorDataset(x[:64], y[:64]),
            evaluate_fn=None,
        ),
    )
    s = t.fit()
    assert s["epochs"] < 40 and any("early stopping" in n for n in s["notes"])


def test_an_early_stopped_run_stopped_while_testing_does_not_train_on_after_resume(tmp_path):
    """Early stopping, then a kill while scoring the test split: the resume redoes the last validation (last.pt was
    written right before it), stops early again and tests; it never trains past the early stop."""
    x, y = data()
    fail = [True]

    def make_task() -> Task:
        def evaluate(model, split, device):
            if split == "test" and fail[0]:
                raise KeyboardInterrupt  # stands in for the kill
            xs, ys = (x, y) if split == "test" else (x[:64], y[:64] + 5.0)
            return {f"{split}_loss": float(((model(xs.to(device)) - ys.to(device)) ** 2).mean())}

        return Task("toy", toy(), TensorDataset(x, y), TensorDataset(x[:64], y[:64] + 5.0), TensorDataset(x, y),
                    evaluate_fn=evaluate, monitor_metric="val_loss")  # fmt: skip

    kw = dict(epochs=40, lr=3e-2, early_stopping_patience=2)
    fail[0] = False
    ref = Trainer(toy_config(tmp_path, run_name="ref", **kw), make_task()).fit()
    assert ref["epochs"] < 40
    fail[0] = True
    with pytest.raises(KeyboardInterrupt):
        Trainer(toy_config(tmp_path, run_name="cut", **kw), make_task()).fit()
    fail[0] = False
    done = Trainer(toy_config(tmp_path, resume=str(tmp_path / "cut"), **kw), make_task()).fit()
    assert (done["steps"], done["final_metrics"]) == (ref["steps"], ref["final_metrics"])


def test_max_batches_counts_batches_and_the_last_step_validates_once(tmp_path):
    t = Trainer(
        toy_config(tmp_path, epochs=100, max_batches=12, accumulate_grad_batches=2, val_check_batches=6),
        Task("toy", toy(), TensorDataset(*data()), TensorDataset(*data(64))),
    )
    s = t.fit()
    assert s["steps"] == 6  # 12 batches = 6 optimizer steps of 2 micro-batches
    assert [r["step"] for r in metric_rows(t.run_dir) if r["kind"] == "val"] == [3, 6]


def test_optimizer_step_state_round_trips():
    p = nn.Parameter(torch.ones(2))
    o = OptimizerStep(
        torch.optim.SGD([p], lr=0.1),
        type("S", (), {"step": lambda *a: None})(),
        torch.device("cpu"),
        fp16=False,
    )
    p.grad = torch.tensor([float("inf"), 0.0])
    o.step()
    assert o.skip_counts() == (1, 1)
    o2 = OptimizerStep(torch.optim.SGD([p], lr=0.1), None, torch.device("cpu"), fp16=False)
    o2.load_state_dict(o.state_dict())
    assert o2.skip_counts() == (1, 1)


def test_a_run_dir_left_without_checkpoint_is_reused(tmp_path):
    """An earlier start killed before its first checkpoint left nothing to lose: the name is reused."""
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    (tmp_path / "run" / ".plainloop-run").write_text("1234\n")  # the mark of a directory plainloop claimed
    t = Trainer(toy_config(tmp_path, epochs=1), Task("toy", toy(), TensorDataset(*data())))
    t.fit()
    assert t.run_dir == tmp_path / "run" and any("reusing" in n for n in t.notes)


def test_a_directory_that_is_not_a_run_is_never_reused(tmp_path):
    """A folder of the user's with the run's name (no checkpoint, their own config.json) was "reused" and its
    config.json overwritten; it is left alone and the run goes to NAME-2."""
    mine = tmp_path / "run"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    t = Trainer(toy_config(tmp_path, epochs=1), Task("toy", toy(), TensorDataset(*data())))
    t.fit()
    assert t.run_dir == tmp_path / "run-2" and sorted(p.name for p in mine.iterdir()) == ["config.json"]
    assert (mine / "config.json").read_text() == '{"mine": true}'


def test_nan_targets_get_the_masked_loss_and_others_the_plain_one(tmp_path):
    x, y = data()
    y[::7] = float("nan")  # missing labels, as land cells are
    t = Trainer(toy_config(tmp_path, epochs=1), Task("toy", toy(), TensorDataset(x, y)))
    s = t.fit()
    assert any("finite targets only" in n for n in s["notes"]) and s["skipped_steps"] == 0
    plain = Trainer(toy_config(tmp_path, run_name="plain", epochs=1), Task("toy", toy(), TensorDataset(*data())))
    assert plain.loss_fn.__name__ == "plain_mse_loss" and t.loss_fn.__name__ == "masked_mse_loss"
