"""Never lose a run, part three: one owner per run whatever happens to its .lock, no code run from a run directory,
full disks and vanished directories named with exit code 4, one table of exit codes, signals that were ignored stay
ignored, bounded config parsing, and the engine's one-line refusals of a loss or a model it cannot train.

Most cases run in-process on a toy task; the ones about a process (the lock, nohup, a closed stdout) run one.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import TensorDataset

import train_optimized as cli
from tests.helpers import toy_config
from trainer import Task, Trainer
from trainer.checkpoint import (
    STORAGE_ERRNOS,
    CheckpointError,
    StorageError,
    atomic_save,
    atomic_write,
    load_checkpoint,
)
from trainer.cli.options import MAX_CONFIG_VALUES
from trainer.config import ConfigError
from trainer.finish import TrainingDiverged, TrainingStopped
from trainer.runfiles import RunDirError, RunDirGone, RunLock, find_resumable, held_by_live_process, roll_back_metrics
from trainer.state import RunFinished
from trainer.step import LossError

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")

# a task file of the user's: its builder's `mode` turns one hostile behaviour on
TASK_FILE = """
import os, shutil, signal
from pathlib import Path
import torch
from torch import nn
from torch.utils.data import TensorDataset
from trainer import Task, TrainConfig

TRAIN_DEFAULTS = {"epochs": 1, "batch_size": 8}


def build(cfg: TrainConfig, *, mode: str = "plain") -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    torch.manual_seed(0)
    calls = [0]

    def loss_fn(model, batch):
        calls[0] += 1
        if mode == "rmdir" and calls[0] == 3:
            shutil.rmtree(Path(cfg.output_dir) / cfg.run_name)
        # two Ctrl-C at once in epoch 1, or in epoch 2 (calls 9-16 are epoch 1's validation: best.pt is written)
        if (mode == "sigint2" and calls[0] == 3) or (mode == "sigint2late" and calls[0] == 20):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return ((model(batch[0]) - batch[1]) ** 2).mean()

    return Task("toy", nn.Linear(4, 1), data, data, loss_fn=loss_fn)
"""


def _toy(n: int = 64, **kw) -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    torch.manual_seed(0)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    return Task("toy", kw.pop("model", None) or nn.Linear(4, 1), data, kw.pop("val_set", data), **kw)


def _main(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:  # TrainingStopped / TrainingDiverged leave main as SystemExit, as at a shell
        return int(e.code or 0)


@pytest.fixture
def task_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mytask.py").write_text(TASK_FILE)
    return "mytask.py:build"


# ------------------------------------------------------------------------------------------- one owner per run
_HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[2])
from trainer.runfiles import RunLock
lock = RunLock(__import__("pathlib").Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()  # held until the test closes stdin or kills it: however slow the test, never let go early
"""


def test_a_live_run_stays_its_owners_when_its_lock_file_is_deleted(tmp_path):
    """The lock is on the directory itself: deleting RUN_DIR/.lock (as users do with a "stale" lock) lets no second
    process in, and --resume auto leaves the run alone."""
    run = tmp_path / "era5-live"
    (run / "checkpoints").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run), str(ROOT)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        (run / ".lock").unlink()
        with pytest.raises(RunDirError, match=f"another live process \\(pid {holder.pid}\\)|pid unknown"):
            RunLock(run)
        assert held_by_live_process(run)
        assert not (run / ".lock").exists(), "a refused process wrote the owner's record"
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock(run)  # the owner is gone: the lock is free
    lock.release()


def test_a_live_run_before_its_first_last_pt_is_named_live_not_missing(task_file, tmp_path, capsys):
    """Early in a run (checkpoint_interval is 60 s) only best.pt may exist: a second process's --resume said
    "last.pt does not exist". The lock is now asked first, at both doors; --resume auto --run_name starts a run of
    its own beside it, and says why."""
    run = tmp_path / "out" / "live"
    atomic_save({"model": {"w": torch.zeros(1)}, "step": 1}, run / "checkpoints" / "best.pt")
    (run / ".plainloop-run").write_text("1\n")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run), str(ROOT)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        live = f"is being written by another live process (pid {holder.pid})"
        for target in ("out/live", "out/live/checkpoints/best.pt"):
            assert _main(["--resume", target, "--task", task_file]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"error: out/live {live}") and "does not exist" not in err
            assert "wait for it to end (a stop signal to it writes last.pt), then resume" in err
        with pytest.raises(RunDirError, match=re.escape(live)):
            Trainer(toy_config(tmp_path / "out", run_name="x", resume=str(run)), _toy())
        argv = ["--resume", "auto", "--run_name", "live", "--output_dir", "out", "--task", task_file, "--no-plots"]
        assert _main(argv) == 0
        out = capsys.readouterr().out
        assert f"resume auto: out/live {live} on" in out and "this run starts in a directory of its own" in out
        assert "run dir: out/live is being written by another live process; writing to out/live-2 instead" in out
        assert (
            not (run / "checkpoints" / "last.pt").exists() and (tmp_path / "out" / "live-2" / "summary.json").exists()
        )
    finally:
        holder.kill()
        holder.wait()


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_line(tmp_path):
    (tmp_path / ".lock").write_text(f"{2**22 + 12345} otherhost\n")  # a pid above pid_max's default: no such process
    lock = RunLock(tmp_path)
    assert lock.note and "took over" in lock.note and str(2**22 + 12345) in lock.note
    assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())
    lock.release()
    assert not (tmp_path / ".lock").exists(), "a lock released in order leaves no record behind"
    again = RunLock(tmp_path)
    assert again.note is None
    again.release()


def test_where_a_directory_cannot_be_locked_the_lock_file_is_verified(tmp_path, monkeypatch):
    """Some network file systems refuse an flock on a directory: the lock falls back to .lock itself, and a run whose
    .lock was deleted or replaced stops at its next write instead of sharing the run with a second process."""
    import stat

    import trainer.support.lock as rf

    real = rf._try_lock

    def no_dir_locks(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, "Bad file descriptor")
        real(fd)

    monkeypatch.setattr(rf, "_try_lock", no_dir_locks)
    monkeypatch.delattr(os, "pwrite", raising=False)  # as on Windows, where the lock is always on .lock
    lock = RunLock(tmp_path)
    assert lock.on_file
    assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())  # the owner, for the messages
    with pytest.raises(RunDirError, match="another live process"):
        RunLock(tmp_path)
    lock.check("metrics.jsonl")  # unchanged: fine
    (tmp_path / ".lock").unlink()
    with pytest.raises(RunDirGone, match="or its .lock"):
        lock.check("metrics.jsonl")
    lock.release()


def test_a_deleted_run_directory_stops_the_run_at_its_next_write_with_exit_4(task_file, tmp_path, capsys):
    """rm -rf of a live run's directory: the run stops at its next write with one line, code 4; nothing recreated."""
    code = _main(["--task", task_file, "--mode", "rmdir", "--run_name", "r", "--output_dir", "out",
                  "--no-progress_bar", "--no-plots"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 4, err
    assert "removed or replaced" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "r").exists()


def test_a_replaced_run_directory_is_not_written_either(tmp_path):
    """The directory moved away and a new one made under its name: the run writes into neither."""

    class Swap:
        def on_train_batch_end(self, trainer, *a):
            if trainer.step == 2:
                trainer.run_dir.rename(tmp_path / "moved")
                trainer.run_dir.mkdir()

    t = Trainer(toy_config(tmp_path, epochs=1, batch_size=8, log_every=4), _toy(), callbacks=[Swap()])
    with pytest.raises(RunDirGone):
        t.fit()
    assert list((tmp_path / "run").iterdir()) == []


# ------------------------------------------------------------------------------------------- no code from a run
EVIL = "from pathlib import Path\nPath('ran').write_text('code from a run directory ran')\ndef build(cfg):\n    pass\n"


@pytest.mark.parametrize("via", ["resume", "config"])
def test_a_task_file_named_by_a_run_directory_is_not_imported_unless_named(via, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("evil.py").write_text(EVIL)
    run = tmp_path / "runs" / "got-from-someone"
    atomic_save({"model": {}, "step": 0}, run / "checkpoints" / "last.pt")  # a resume target that passes its check
    (run / "config.toml").write_text('[run]\ntask = "evil.py:build"\n')
    argv = ["--resume", str(run)] if via == "resume" else ["--config", str(run / "config.toml")]
    assert _main(argv) == 2
    err = capsys.readouterr().err
    assert not Path("ran").exists(), "the task file ran"
    assert "--task evil.py:build" in err and "--trust_task" in err and len(err.strip().splitlines()) == 1
    # named on the command line (or trusted), the file is the user's choice: it is imported and its builder called
    for extra in (["--trust_task"], ["--task", "evil.py:build"]):
        assert _main([*argv, *extra]) == 2
        assert "build returned NoneType" in capsys.readouterr().err
        assert Path("ran").exists()


def test_trust_task_cannot_come_from_a_config_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("evil.py").write_text(EVIL)
    Path("c.toml").write_text('[run]\ntask = "evil.py:build"\ntrust_task = true\n')
    assert _main(["--config", "c.toml"]) == 2
    assert not Path("ran").exists()


def test_the_printed_resume_line_names_the_task_file(task_file, tmp_path, capsys):
    """A stop's resume line (and the re-run line) carry --task, so the printed command works as it is."""
    from trainer.usercode import resume_hint

    code = _main(["--task", task_file, "--run_name", "r", "--output_dir", "out", "--no-progress_bar", "--no-plots"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"--config out/r/config.toml --task {task_file}" in out
    from trainer.cli.command import cli_session, set_task_flag

    set_task_flag(task_file)
    with cli_session():
        assert resume_hint("out/r").endswith(f"--resume out/r --task {task_file}")
    set_task_flag(None)


# ------------------------------------------------------------------------------------------- storage
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(err=st.sampled_from(sorted(STORAGE_ERRNOS)), written=st.integers(0, 5000))
def test_a_failed_write_names_the_file_keeps_the_old_one_and_leaves_no_temp(err, written, tmp_path):
    target = tmp_path / "last.pt"
    target.write_bytes(b"old")

    def write(fh):
        fh.write(b"x" * written)
        raise OSError(err, os.strerror(err))

    with pytest.raises(StorageError) as e:
        atomic_write(target, write)
    assert str(target) in str(e.value) and e.value.errno == err and cli.exit_code(e.value) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"] and target.read_bytes() == b"old"


def test_a_checkpoint_larger_than_the_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    import trainer.support.files as ck

    target = tmp_path / "last.pt"
    target.write_bytes(b"old")
    monkeypatch.setattr(ck, "shutil", SimpleNamespace(disk_usage=lambda p: _Usage(free=10_000)))
    with pytest.raises(StorageError, match="needs about 0.4 MB") as e:
        atomic_save({"model": {"w": torch.zeros(100_000)}}, target)
    assert e.value.errno == errno.ENOSPC and str(target) in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"] and target.read_bytes() == b"old"


class _Usage:
    def __init__(self, free: int) -> None:
        self.total, self.used, self.free = 10**12, 10**12 - free, free


def test_a_full_disk_during_a_checkpoint_save_exits_4_naming_the_file(task_file, tmp_path, monkeypatch, capsys):
    import trainer.support.files as ck

    monkeypatch.setattr(ck, "shutil", SimpleNamespace(disk_usage=lambda p: _Usage(free=100)))  # the saves' view
    code = _main(["--task", task_file, "--run_name", "r", "--output_dir", "out", "--no-progress_bar", "--no-plots"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "checkpoints/" in err and ".pt" in err and "free" in err and "Traceback" not in err
    assert not [p for p in (tmp_path / "out" / "r").rglob("*.tmp")]


@pytest.mark.parametrize(
    "exc, code",
    [
        (StorageError("x", errno.ENOSPC, "f"), 4),
        (PermissionError(errno.EACCES, "Permission denied", "f"), 4),
        (OSError(errno.EROFS, "Read-only file system"), 4),
        (ConfigError("--lr nan: not a number"), 2),
        (FileNotFoundError(errno.ENOENT, "No such file", "data.nc"), 2),
    ],
)
def test_exit_codes_of_errors(exc, code):
    assert cli.exit_code(exc) == code


def test_a_background_save_that_hit_a_full_disk_is_exit_4():
    try:
        try:
            raise StorageError("writing runs/r/checkpoints/last.pt failed: No space left", errno.ENOSPC)
        except StorageError as inner:
            raise CheckpointError("writing runs/r/checkpoints/last.pt in the background failed") from inner
    except CheckpointError as e:
        assert cli.exit_code(e) == 4


def test_a_background_write_never_recreates_a_removed_run_directory(tmp_path):
    """The run directory removed while a write was on its way: the write fails with exit 4 and creates nothing."""
    from trainer.state import Checkpointer

    gone = tmp_path / "run"
    with pytest.raises(StorageError, match="is gone") as e:
        Checkpointer._write({"model": {}}, gone / "checkpoints" / "last.pt", None, None)
    assert not gone.exists() and cli.exit_code(e.value) == 4


def test_a_directory_where_a_file_should_be_gets_a_clear_line(tmp_path):
    (tmp_path / "checkpoints" / "last.pt").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="last.pt is a directory, not a checkpoint file"):
        load_checkpoint(tmp_path)
    (tmp_path / "summary.json").mkdir()
    with pytest.raises(StorageError, match="summary.json: a directory is in its place"):
        atomic_write(tmp_path / "summary.json", lambda fh: fh.write(b"{}"))


# ------------------------------------------------------------------------------------------- exit codes
def test_one_table_of_exit_codes_in_help_and_docs(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    docs = (ROOT / "docs" / "guides" / "cli.md").read_text(encoding="utf-8")
    for code in cli.EXIT_CODES:
        assert code in out
        assert f"| {code} |" in docs, f"exit code {code} is missing from docs/guides/cli.md's table"
    assert " ".join(out.split()).count("128+N stopped by signal N") == 1


@pytest.mark.slow
def test_a_closed_stdout_does_not_change_the_exit_code(task_file, tmp_path):
    """`| head -1`: the reader goes after the first line; the run still trains to its end and exits 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}  # each line reaches the pipe at once
    argv = ["--task", task_file, "--run_name", "r", "--output_dir", "out", "--no-progress_bar", "--no-plots"]
    p = subprocess.Popen([sys.executable, str(ROOT / "train_optimized.py"), *argv], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=600) == 0, err  # the timeout only catches a hang
    assert "Traceback" not in err and "Exception ignored" not in err
    assert json.loads((tmp_path / "out" / "r" / "summary.json").read_text())["steps"] == 8


def _nan_after(first: int, model: nn.Module | None = None):
    calls = [0]

    def loss_fn(m, batch):
        calls[0] += m.training  # training steps only: validation uses the loss too
        loss = ((m(batch[0]) - batch[1]) ** 2).mean()
        return loss * float("nan") if m.training and calls[0] > first else loss

    return loss_fn


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(good=st.integers(0, 16), log_every=st.sampled_from([1, 5, 50]))
def test_a_short_run_with_most_steps_skipped_exits_3_checked_at_the_end(good, log_every, tmp_path_factory):
    """16 steps, the first `good` finite, the others NaN: more than half skipped is a diverged run (exit code 3),
    whether or not a log point came after the skips (the limit of 20 in a row is never reached)."""
    tmp = tmp_path_factory.mktemp("skips")
    t = Trainer(toy_config(tmp, epochs=2, batch_size=8, log_every=log_every), _toy(loss_fn=_nan_after(good)))
    skipped = 16 - good
    if skipped >= 2 and 2 * skipped > 16:
        with pytest.raises(TrainingDiverged) as e:
            t.fit()
        assert e.value.code == 3
        rows = [json.loads(r) for r in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
        assert any(r.get("event") == "diverged" and f"{skipped} of the 16" in r["message"] for r in rows)
    else:
        assert t.fit()["skipped_steps"] == skipped


def test_lr_1e30_on_the_command_line_exits_3(task_file, capsys):
    code = _main(["--task", task_file, "--lr", "1e30", "--run_name", "r", "--output_dir", "out", "--no-progress_bar",
                  "--no-plots", "--log_every", "50"])  # fmt: skip
    assert code == 3, capsys.readouterr()
    assert "optimizer steps of this run had non-finite" in capsys.readouterr().out


def test_lr_1e30_is_a_diverged_run(tmp_path):
    t = Trainer(toy_config(tmp_path, epochs=2, batch_size=8, lr=1e30, warmup_steps=0, log_every=50), _toy())
    with pytest.raises(TrainingDiverged) as e:
        t.fit()
    assert e.value.code == 3


# ------------------------------------------------------------------------------------------- signals
_NOHUP = """
import os, signal, sys
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts it
sys.path.insert(0, sys.argv[2])
import torch
from torch.utils.data import TensorDataset
from tests.helpers import toy_config
from trainer import Task, Trainer

class Hangup:
    def on_train_batch_end(self, trainer, *a):
        if trainer.step == 2:
            os.kill(os.getpid(), signal.SIGHUP)

x = torch.randn(64, 4)
task = Task("toy", torch.nn.Linear(4, 1), TensorDataset(x, x.sum(1, keepdim=True)))
summary = Trainer(toy_config(sys.argv[1], epochs=1, batch_size=8), task, callbacks=[Hangup()]).fit()
print("steps", summary["steps"], "stopped_by" in summary)
"""


@pytest.mark.slow
def test_a_signal_ignored_at_start_stays_ignored(tmp_path):
    """nohup: the terminal's SIGHUP reaches the run, which goes on to its end."""
    p = subprocess.run([sys.executable, "-c", _NOHUP, str(tmp_path), str(ROOT)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "steps 8 False" in p.stdout


def test_a_second_ctrl_c_stops_at_once_without_a_traceback(task_file, capsys):
    """Before the run's first last.pt (checkpoint_interval is 60 s) the line said "checkpoints/last.pt is the last
    one saved (resume from it)", and that resume failed: it now says nothing was saved and that starting again is the
    way."""
    # no time-based last.pt before the stop, however slow the machine (the default interval is 60 s of training)
    code = _main(["--task", task_file, "--mode", "sigint2", "--run_name", "r", "--output_dir", "out",
                  "--no-progress_bar", "--no-plots", "--checkpoint_interval", "3600"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err and "SIGINT again" in err
    assert len(err.strip().splitlines()) == 1 and "resume from it" not in err and "best.pt" not in err
    assert "no checkpoint was saved yet (out/r/checkpoints/last.pt does not exist)" in err
    assert f"start again with python train_optimized.py --config out/r/config.toml --task {task_file}" in err
    assert _main(["--resume", "out/r", "--task", task_file]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: out/r/checkpoints/last.pt does not exist: the run stopped before it saved a checkpoint"
    )
    assert "start the run again" in err


def test_a_second_ctrl_c_after_best_pt_names_it_and_a_resume_from_it_continues(task_file, capsys):
    argv = ["--task", task_file, "--epochs", "3", "--output_dir", "out", "--no-progress_bar", "--no-plots"]
    # no time-based last.pt before the stop, however slow the machine (the default interval is 60 s of training)
    assert _main([*argv, "--mode", "sigint2late", "--run_name", "b", "--checkpoint_interval", "3600"]) == 130
    err = capsys.readouterr().err
    best = Path("out/b/checkpoints/best.pt")
    assert "no checkpoint was saved yet" in err and not Path("out/b/checkpoints/last.pt").exists()
    assert f"{best} holds the best weights so far (--resume {best} continues from it)" in err
    assert _main(["--resume", "out/b", "--task", task_file]) == 2
    err = capsys.readouterr().err
    assert "the run stopped before its first last.pt; out/b/checkpoints/best.pt holds its best weights" in err
    assert _main(["--resume", str(best), "--task", task_file, "--max_steps", "12", "--no-plots"]) == 0
    assert json.loads(Path("out/b/summary.json").read_text())["steps"] == 12
    # with last.pt written (at every epoch end here), the line names it and the printed resume continues
    assert _main([*argv, "--mode", "sigint2late", "--run_name", "c", "--checkpoint_interval", "0"]) == 130
    err = capsys.readouterr().err
    line = f"python train_optimized.py --resume out/c --task {task_file}"
    assert f"out/c/checkpoints/last.pt is the last checkpoint saved; resume with: {line}" in err
    assert _main(["--resume", "out/c", "--task", task_file, "--max_steps", "12", "--no-plots"]) == 0


def test_sigterm_during_the_final_test_says_training_ended_and_the_resume_finishes(tmp_path, capsys):
    """It said "during set-up ... nothing to resume" after 48 steps; now: training ended, the trained weights are
    in last.pt, and the printed resume scores the test split and writes the summary without training again."""
    killed = [False]

    def evaluate(model, split, batches=None, **kw):
        if split == "test" and not killed[0]:
            killed[0] = True
            os.kill(os.getpid(), signal.SIGTERM)
        return {"val_loss": 1.0}

    def task():
        return _toy(test_set=_toy().train_set, evaluate_fn=evaluate)

    with pytest.raises(TrainingStopped) as e:
        Trainer(toy_config(tmp_path, epochs=1, batch_size=8), task()).fit()
    out = capsys.readouterr().out
    assert e.value.code == 143
    assert "after training ended at step 8" in out and "set-up" not in out
    assert not (tmp_path / "run" / "summary.json").exists()
    summary = Trainer(toy_config(tmp_path, epochs=1, batch_size=8, resume=str(tmp_path / "run")), task()).fit()
    assert summary["steps"] == 8 and summary["steps_this_process"] == 0 and "stopped_by" not in summary


def test_a_finished_run_says_how_to_train_longer_in_the_words_of_each_door(task_file, tmp_path, capsys):
    """RunFinished said "give more --epochs or --max_steps" to Python users too: each door now gets its own line."""
    run = str(tmp_path / "run")
    Trainer(toy_config(tmp_path, epochs=1), _toy()).fit()
    with pytest.raises(RunFinished) as e:
        Trainer(toy_config(tmp_path, epochs=1, resume=run), _toy())
    assert (
        f"To train it longer, resume it with more steps: TrainConfig(..., resume={run!r}, epochs=N), with N above 1"
        in str(e.value)
    )
    assert "--" not in str(e.value)
    Trainer(toy_config(tmp_path, run_name="steps", max_steps=3), _toy()).fit()
    with pytest.raises(RunFinished, match=r"max_steps=N\), with N above 3$"):
        Trainer(toy_config(tmp_path, run_name="steps", max_steps=3, resume=str(tmp_path / "steps")), _toy())
    argv = ["--task", task_file, "--output_dir", "out", "--no-progress_bar", "--no-plots"]
    assert _main([*argv, "--run_name", "r"]) == 0
    capsys.readouterr()
    assert _main(["--resume", "out/r", "--task", task_file]) == 0
    out = capsys.readouterr().out
    line = f"python train_optimized.py --resume out/r --task {task_file} --epochs N, with N above 1"
    assert f"resume it with more steps: {line}" in out
    assert "TrainConfig" not in out


# ------------------------------------------------------------------------------------------- --resume auto
def _checkpoint(run: Path, step: int) -> None:
    atomic_save({"model": {"w": torch.zeros(2)}, "step": step}, run / "checkpoints" / "last.pt")


def test_resume_auto_passes_over_a_run_whose_last_pt_is_corrupt(tmp_path):
    good, bad = tmp_path / "era5-a", tmp_path / "era5-b"
    _checkpoint(good, 3)
    _checkpoint(bad, 5)
    data = (bad / "checkpoints" / "last.pt").read_bytes()
    (bad / "checkpoints" / "last.pt").write_bytes(data[: len(data) // 2])  # truncated
    now = time.time()
    os.utime(good / "checkpoints" / "last.pt", (now - 100, now - 100))
    notes: list[str] = []
    assert find_resumable(tmp_path, "era5", notes) == good
    assert len(notes) == 1 and str(bad) in notes[0] and "cannot be read" in notes[0]


# ------------------------------------------------------------------------------------------- config files
def _render(fmt: str, pairs: list[tuple[str, int]]) -> str:
    if fmt == "json":
        return "{\n" + ",\n".join(f'  "{k}": {v}' for k, v in pairs) + "\n}\n"
    if fmt == "yaml":
        return "".join(f"{k}: {v}\n" for k, v in pairs)
    return "".join(f"{k} = {v}\n" for k, v in pairs)


KEYS = ["epochs", "lr", "batch_size", "seed", "max_steps", "num_workers"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(["json", "yaml", "toml"]), keys=st.lists(st.sampled_from(KEYS), min_size=2, max_size=6),
       data=st.data())  # fmt: skip
def test_a_key_set_twice_is_refused_with_its_line(fmt, keys, data, tmp_path):
    from trainer.cli.options import load_config_file

    pairs = [(k, i + 1) for i, k in enumerate(keys)]
    path = tmp_path / f"c.{fmt}"
    path.write_text(_render(fmt, pairs))
    dup = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if dup is None:
        assert load_config_file(path) == dict(pairs)
        return
    first = keys.index(dup)
    again = keys.index(dup, first + 1)
    with pytest.raises(ConfigError) as e:
        load_config_file(path)
    line = again + 1 + (fmt == "json")  # JSON's first line is the brace
    assert str(path) in str(e.value) and f"line {line}" in str(e.value), str(e.value)


def test_a_key_in_two_tables_is_refused(tmp_path):
    from trainer.cli.options import load_config_file

    path = tmp_path / "c.toml"
    path.write_text("lr = 0.1\n[train]\nepochs = 2\nlr = 0.2\n")
    with pytest.raises(ConfigError, match="'lr' is set twice on line 4 \\(first on line 1\\)"):
        load_config_file(path)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fan=st.integers(5, 12), levels=st.integers(6, 10), in_list=st.booleans())
def test_a_yaml_alias_bomb_is_refused_at_once(fan, levels, in_list, tmp_path):
    from trainer.cli.options import load_config_file

    lines = ["a0: &a0 [" + ", ".join(["1"] * fan) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]")
    top = "[" + ", ".join([f"*a{levels - 1}"] * fan) + "]"
    lines.append(f"lat: {top if in_list else f'*a{levels - 1}'}")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    nodes = [1 + fan]  # a0: one list of `fan` numbers; each level one list of `fan` of the level below
    for _ in range(1, levels):
        nodes.append(1 + fan * nodes[-1])
    values = 1 + sum(nodes) + (1 + fan * nodes[-1] if in_list else nodes[-1])  # the table, every key, expanded
    if values <= 100_000:
        assert len(load_config_file(path)["lat"]) == fan
        return
    with pytest.raises(ConfigError, match="more than 100000 values"):
        load_config_file(path)
    # and it stops at the first excess (a full walk is up to 12**11 values): the walk of the same shape is counted
    assert _values_walked(fan, levels, in_list, path) <= (MAX_CONFIG_VALUES + 1) * fan


def _values_walked(fan: int, levels: int, in_list: bool, path: Path) -> int:
    """How many values _bounded takes out of the lists of an alias bomb shaped as the YAML above (PyYAML builds
    each alias as the one shared list) before it refuses it."""
    from trainer.cli.options import _bounded

    walked = [0]

    class Counted(list):
        def __iter__(self):
            for v in super().__iter__():
                walked[0] += 1
                yield v

    level = Counted([1] * fan)
    doc = {"a0": level}
    for i in range(1, levels):
        level = doc[f"a{i}"] = Counted([level] * fan)
    doc["lat"] = Counted([level] * fan) if in_list else level
    with pytest.raises(ConfigError, match="more than 100000 values"):
        _bounded(doc, path)
    return walked[0]


@pytest.mark.parametrize("fmt", ["json", "yaml", "toml"])
def test_a_deeply_nested_config_is_refused(fmt, tmp_path):
    from trainer.cli.options import load_config_file

    path = tmp_path / f"deep.{fmt}"
    deep = "[" * 40 + "1" + "]" * 40
    path.write_text({"json": f'{{"lat": {deep}}}', "yaml": f"lat: {deep}\n", "toml": f"lat = {deep}\n"}[fmt])
    with pytest.raises(ConfigError, match="nested deeper"):
        load_config_file(path)


# ------------------------------------------------------------------------------------------- damaged metrics
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b), at=st.integers(0, 4))
@example(junk=b"\r\x00", at=0)  # a carriage return inside junk is not a line end of metrics.jsonl
def test_junk_in_metrics_jsonl_never_blocks_a_resume(junk, at, tmp_path):
    rows = [json.dumps({"kind": "train", "step": s}).encode() + b"\n" for s in (1, 2, 3, 4)]
    lines = [*rows[:at], junk + b"\n", *rows[at:]]
    (tmp_path / "metrics.jsonl").write_bytes(b"".join(lines))
    found: list[int] = []
    moved = roll_back_metrics(tmp_path, 3, junk=found)
    kept = (tmp_path / "metrics.jsonl").read_bytes().splitlines()
    try:
        is_row = isinstance(json.loads(junk.decode("utf-8")), dict)
    except ValueError:
        is_row = False
    if not is_row:
        assert found == [at + 1] and moved == 1  # the step-4 row
        assert kept == [r.rstrip(b"\n") for r in rows[:3]]
        assert junk in (tmp_path / "metrics.rolled_back.jsonl").read_bytes()


def test_junk_in_metrics_jsonl_is_named_on_resume(tmp_path, capsys):
    Trainer(toy_config(tmp_path, epochs=1, batch_size=8), _toy()).fit()
    with open(tmp_path / "run" / "metrics.jsonl", "ab") as fh:
        fh.write(b"\xff\xfe not json\n")
    Trainer(toy_config(tmp_path, epochs=2, batch_size=8, resume=str(tmp_path / "run")), _toy()).fit()
    out = capsys.readouterr().out
    assert "metrics.jsonl: line(s)" in out and "not JSON rows" in out


# ------------------------------------------------------------------------------------------- what cannot train
def _float_loss(m, b):
    return float(((m(b[0]) - b[1]) ** 2).mean())


def _detached_loss(m, b):
    return ((m(b[0]) - b[1]) ** 2).mean().detach()


def _vector_loss(m, b):
    return (m(b[0]) - b[1]) ** 2


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"loss_fn": _float_loss}, "the loss is a float"),
        ({"loss_fn": _detached_loss}, "does not depend on any trainable weight"),
        ({"loss_fn": _vector_loss}, "the loss has shape (8, 1), not one value"),
    ],
)
def test_a_loss_backward_cannot_use_is_one_line(kw, words, tmp_path):
    with pytest.raises(LossError) as e:
        Trainer(toy_config(tmp_path, epochs=1, batch_size=8), _toy(**kw)).fit()
    assert words in str(e.value) and "\n" not in str(e.value)


def _frozen() -> nn.Module:
    return nn.Linear(4, 1).requires_grad_(False)


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"model": _frozen()}, "no trainable parameters"),
        ({"model": nn.Linear(4, 1).double()}, "parameters are torch.float64 and the data's inputs torch.float32"),
        ({"monitor_mode": "maximise"}, "did you mean 'max'?"),
        ({"monitor_mode": "minimum"}, "did you mean 'min'?"),
    ],
)
def test_a_model_or_task_that_cannot_train_is_refused_before_the_run_directory(kw, words, tmp_path):
    with pytest.raises(ValueError, match=words.replace("(", "\\(").replace(")", "\\)").replace("?", "\\?")):
        Trainer(toy_config(tmp_path, epochs=1, batch_size=8), _toy(**kw))
    assert not list(tmp_path.iterdir())


def test_an_evaluate_fn_without_the_monitored_metric_is_refused_at_the_first_validation(tmp_path):
    task = _toy(evaluate_fn=lambda model, split, batches=None, **kw: {"acc": 0.5})
    with pytest.raises(ValueError, match="'val_loss' is not among the scores evaluate_fn returned \\(acc\\)"):
        Trainer(toy_config(tmp_path, epochs=1, batch_size=8), task).fit()
    assert not (tmp_path / "run" / "checkpoints" / "best.pt").exists()


def test_resume_given_a_fifo_names_the_flag(tmp_path, capsys):
    os.mkfifo(tmp_path / "fifo")
    assert _main(["--resume", str(tmp_path / "fifo")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume ") and "FIFO" in err


def test_the_launcher_bounds_nproc_per_node():
    env = {**os.environ, "NPROC_PER_NODE": "100000", "PLAINLOOP_DRY_RUN": "1", "SKIP_SETUP": "1"}
    p = subprocess.run(["bash", str(ROOT / "optimize_training.sh")], env=env, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert p.returncode == 2 and "NPROC_PER_NODE=100000 is out of range" in p.stderr


def test_the_stdout_wrapper_drops_writes_after_a_broken_pipe():
    class Broken:
        def write(self, s):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

        def fileno(self):
            raise ValueError("no fd")

    w = cli._Unbreakable(Broken())
    assert w.write("hello\n") == 6 and w.broken
    w.flush()  # no error


def test_a_full_disk_in_metrics_jsonl_names_the_file(tmp_path):
    t = Trainer(toy_config(tmp_path, epochs=1, batch_size=8), _toy())

    class Full:
        def write(self, s):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

        closed = False

        def close(self):
            pass

    class Fill:
        def on_train_start(self, trainer):
            trainer.run.files._metrics = Full()

    t.callbacks.append(Fill())
    with pytest.raises(StorageError) as e:
        t.fit()
    assert "metrics.jsonl" in str(e.value) and e.value.errno == errno.ENOSPC


def test_a_lock_busy_for_one_probe_is_not_a_live_run(tmp_path, monkeypatch):
    """torchrun ranks probing one run's lock at once (--resume auto) must not each see the other as a live writer."""
    import trainer.runfiles as rf
    import trainer.support.lock as lock

    real, calls = lock._try_lock, []

    def busy_once(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # another rank's probe holds it for this one try
            raise OSError(errno.EWOULDBLOCK, "Resource temporarily unavailable")
        real(fd)

    monkeypatch.setattr(lock, "_try_lock", busy_once)
    rf.check_not_live(tmp_path)  # passes on the second try
    assert len(calls) == 2
    monkeypatch.setattr(lock, "_try_lock", real)
    held = RunLock(tmp_path)  # a live writer keeps it: still refused after every try
    with pytest.raises(RunDirError, match="another live process"):
        rf.check_not_live(tmp_path)
    held.release()


def test_a_toml_key_and_a_table_of_one_name_say_where_the_key_goes(tmp_path):
    """`task = "reid"` at the top and a [task] table: tomllib's "Cannot overwrite a value" named no key, and
    "keep one of them" was the wrong fix."""
    from trainer.cli.options import load_config_file

    path = tmp_path / "c.toml"
    path.write_text('task = "reid"\n\n[task]\nnum_instances = 4\n')
    with pytest.raises(ConfigError, match=r"'\[task\]' sets a name set before \(at line 3.*goes under \[run\]"):
        load_config_file(path)
    path.write_text("[train]\nlr = 0.1\nlr = 0.2\n")
    with pytest.raises(ConfigError, match=r"'lr = 0.2' sets a name set before \(at line 3.*keep one of them"):
        load_config_file(path)
