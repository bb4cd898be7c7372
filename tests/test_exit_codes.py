"""The exit-code table (docs/guides/cli.md) for stop signals at every phase: 128+N and one line while the run is not
complete, 0 with one line once summary.json is written, and the same from the torchrun agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.helpers import toy_config
from trainer import Task, Trainer
from trainer.finish import TrainingStopped

ROOT = Path(__file__).resolve().parents[1]


def _task(**kw) -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    torch.manual_seed(0)
    return Task("toy", nn.Linear(4, 1), data, data, **kw)


def _term(*a, **k) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class TermAtStopMonitoring:
    """A monitor that sends this process SIGTERM as training ends (after the loop's last look at the stop flag)."""

    def start_monitoring(self) -> None: ...

    def log_iteration(self, *a) -> None: ...

    def get_summary(self) -> dict:
        return {}

    stop_monitoring = staticmethod(_term)


class TermAtTrainStart:
    on_train_start = staticmethod(_term)


def _worse_each_time():
    calls = []

    def evaluate(model, split, *a, **k):
        calls.append(split)
        return {"val_loss": float(len(calls))}

    return evaluate


@pytest.mark.parametrize("early", [False, True], ids=["last_epoch", "early_stopping"])
def test_a_signal_after_trainings_last_look_at_it_is_not_swallowed(tmp_path, capsys, early):
    """SIGTERM while the last epoch's background save finished or the bar closed (after the loop last checked the
    stop flag) went to a request that was then replaced: exit 0, no line. Now: 143 and the after-training line."""
    kw = {"evaluate_fn": _worse_each_time()} if early else {}
    cfg = toy_config(tmp_path, epochs=3, batch_size=16, early_stopping_patience=1 if early else None)
    with pytest.raises(TrainingStopped) as e:
        Trainer(cfg, _task(**kw), monitor=TermAtStopMonitoring()).fit()
    out = capsys.readouterr().out
    assert e.value.code == 143
    assert f"SIGTERM after training ended at step {8 if early else 12}" in out
    assert not (tmp_path / "run" / "summary.json").exists()  # the printed resume writes it, training nothing


def test_a_signal_after_the_summary_is_one_line_and_exit_0(tmp_path):
    """A SIGTERM while the closing lines print came after summary.json: it crashed on the closed metrics file (exit 1,
    a traceback). The run is complete, so nothing is left to resume: one line, and the exit code stays 0."""
    lines: list[str] = []

    def log(msg: str) -> None:
        lines.append(msg)
        if msg.startswith("[plainloop] done:"):
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(TrainingStopped) as e:
        Trainer(toy_config(tmp_path, epochs=1, batch_size=16), _task(), log=log).fit()
    assert e.value.code == 0
    assert lines[-1] == "[plainloop] SIGTERM after the run finished: it is complete, nothing to resume"
    assert (tmp_path / "run" / "summary.json").is_file()


def test_a_stop_before_the_first_step_says_so(tmp_path, capsys):
    """It said "stopped after step 0 (end of epoch 0)"."""
    with pytest.raises(TrainingStopped) as e:
        Trainer(toy_config(tmp_path, epochs=1), _task(), callbacks=[TermAtTrainStart()]).fit()
    out = capsys.readouterr().out
    assert e.value.code == 143
    assert "SIGTERM: stopped before the first step;" in out and "epoch 0" not in out


def test_fit_twice_names_the_resume_without_a_dangling_phrase(tmp_path):
    """The Python hint ends ", then run python X.py again": the message went on "... again and more epochs"."""
    t = Trainer(toy_config(tmp_path, epochs=1), _task())
    t.fit()
    with pytest.raises(RuntimeError) as e:
        t.fit()
    run = str(tmp_path / "run")
    assert f"make a new Trainer with TrainConfig(..., resume={run!r}) and a larger epochs or max_steps" in str(e.value)
    assert "again and" not in str(e.value)


_AT_EXIT = """
import atexit, os, runpy, signal, sys
atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))  # a stop signal while the interpreter exits
sys.argv = ["train_optimized.py", *sys.argv[1:]]
runpy.run_path("train_optimized.py", run_name="__main__")
"""


def test_a_signal_while_the_program_exits_keeps_its_exit_code(tmp_path):
    """The start-up handler was back in place at interpreter exit: it said "SIGTERM during start-up" and turned the
    program's own exit code (0 for a finished run, 2 here) into 143."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _AT_EXIT, "--resume", str(tmp_path / "nothing-here")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "[plainloop] SIGTERM while exiting: ignored (the run had ended)" in proc.stderr
    assert "during start-up" not in proc.stderr


@pytest.mark.slow
def test_sigterm_to_the_torchrun_agent_is_one_line_and_143(tmp_path):
    """optimize_training.sh runs torchrun through trainer/cli/torchrun.py: a SIGTERM to the agent (the documented
    way to stop a DDP run) ended torchrun's own main with a 28-line traceback and exit 1, after the ranks had saved."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "trainer" / "cli" / "torchrun.py"), "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "ddp_script.py"), str(tmp_path), "agent_sigterm"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 143, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert out.count("[plainloop] torchrun: stopped by SIGTERM") == 1
    assert out.count("Resume with:") == 1  # rank 0's resume line, before the agent's
    assert (tmp_path / "ddp" / "checkpoints" / "last.pt").is_file()


def test_a_short_training_flag_after_the_script_is_the_scripts_not_torchruns():
    """`optimize_training.sh ... --n 4` under torchrun: argparse took `--n` for an abbreviation of `--nnodes` and
    stopped with torchrun's usage (ambiguous option)."""
    from trainer.cli.torchrun import parse

    args = parse(["--nproc_per_node", "2", "train_optimized.py", "--n", "4", "--nproc", "9"])
    assert args.nproc_per_node == "2" or args.nproc_per_node == 2
    assert args.training_script == "train_optimized.py" and args.training_script_args == ["--n", "4", "--nproc", "9"]
