"""The Python door does what the command line does: resume="auto", the closing lines, the CPU thread choice."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from helpers import toy_config
from torch import nn
from torch.utils.data import TensorDataset

from trainer import Task, Trainer
from trainer.finish import TrainingStopped, closing_lines
from trainer.runtime import SMALL_MODEL, cpu_threads
from trainer.state import RunFinished
from utils.bottleneck import diagnose

pytestmark = pytest.mark.usefixtures("one_thread")


def small_task(name: str = "mine") -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 4, generator=g)
    y = x.sum(1, keepdim=True)
    torch.manual_seed(0)
    return Task(name, nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), TensorDataset(x, y),
                TensorDataset(x[:32], y[:32]))  # fmt: skip


class StopAt:
    """SIGTERM at optimizer step `step`: the run saves last.pt and stops, as a job cut short does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, outputs, batch, batch_idx) -> None:
        if trainer.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the flag


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)["model"]


# ------------------------------------------------------------------------------------------- resume="auto"
def test_resume_auto_continues_the_latest_run_of_its_output_dir(tmp_path, capsys):
    """TrainConfig(resume="auto") raised "checkpoint auto does not exist"; it continues the newest unfinished run, as
    --resume auto does, and ends with the weights of a run that was never stopped."""
    whole = tmp_path / "whole"
    Trainer(toy_config(whole, run_name=None, epochs=3), small_task()).fit()
    cut = tmp_path / "cut"
    with pytest.raises(TrainingStopped):
        Trainer(toy_config(cut, run_name=None, epochs=3), small_task(), callbacks=[StopAt(5)]).fit()
    (run,) = cut.iterdir()
    assert run.name.startswith("mine-") and torch.load(run / "checkpoints" / "last.pt", weights_only=False)["step"] == 5
    capsys.readouterr()
    summary = Trainer(toy_config(cut, run_name=None, epochs=3, resume="auto"), small_task()).fit()
    assert summary["run_dir"] == str(run) and summary["steps"] == 9 and list(cut.iterdir()) == [run]
    assert f"resume: {run} at step 5" in capsys.readouterr().out
    (done,) = whole.iterdir()
    a, b = weights(done), weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_auto_with_nothing_to_resume_starts_a_new_run_and_says_so(tmp_path, capsys):
    summary = Trainer(toy_config(tmp_path, run_name=None, epochs=1, resume="auto"), small_task()).fit()
    out = capsys.readouterr().out
    assert f"[plainloop] resume auto: nothing to resume under {tmp_path} (no unfinished mine-* run" in out
    assert summary["steps"] == 3 and Path(str(summary["run_dir"])).parent == tmp_path
    # a finished run is not resumed either, and run_name names the one to continue
    capsys.readouterr()
    Trainer(toy_config(tmp_path, run_name="p", epochs=1, resume="auto"), small_task()).fit()
    assert f"resume auto: nothing to resume under {tmp_path / 'p'}; starting a new run" in capsys.readouterr().out
    with pytest.raises(TrainingStopped):
        Trainer(toy_config(tmp_path, run_name="q", epochs=2), small_task(), callbacks=[StopAt(2)]).fit()
    again = Trainer(toy_config(tmp_path, run_name="q", epochs=2, resume="auto"), small_task()).fit()
    assert again["run_dir"] == str(tmp_path / "q") and again["steps_this_process"] == 4


def test_resume_auto_of_a_run_that_ended_is_one_line_and_exit_0_as_on_the_command_line(tmp_path, capsys):
    """TrainConfig(run_name=..., resume="auto") run again after the run finished (a requeued job) raised RunFinished
    with a traceback, where --resume auto prints one line and exits 0; an explicit resume= still raises it."""
    Trainer(toy_config(tmp_path, run_name="fixed", epochs=1), small_task()).fit()
    before = (tmp_path / "fixed" / "summary.json").read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        Trainer(toy_config(tmp_path, run_name="fixed", epochs=1, resume="auto"), small_task())
    assert e.value.code == 0 and type(e.value) is SystemExit
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"[plainloop] {tmp_path / 'fixed'}: the run finished at step 3; ")
    assert (tmp_path / "fixed" / "summary.json").read_bytes() == before
    with pytest.raises(RunFinished):
        Trainer(toy_config(tmp_path, run_name="fixed", epochs=1, resume=str(tmp_path / "fixed")), small_task())


# ------------------------------------------------------------------------------------------- the closing lines
def test_fit_ends_with_the_done_line_and_the_run_directory(tmp_path, capsys):
    """The README's 10-line example ended after its last epoch line: no done line, no run directory."""
    summary = Trainer(toy_config(tmp_path, epochs=1), small_task()).fit()
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith("[plainloop] done: 3 steps in ") and lines[-2].endswith(
        " 0 skipped, verdict: not judged"
    )
    assert lines[-1] == f"[plainloop] run directory: {tmp_path / 'run'}" and summary["run_dir"] == lines[-1][27:]


def test_the_closing_lines_print_what_callbacks_put_in_the_summary():
    s = {"steps": 9, "steps_this_process": 4, "train_time_s": 1.25, "samples_per_s": 320.4, "skipped_steps": 1,
         "verdict": {"verdict": "contended", "headline": "contended: other processes used 1.1 of 2 CPU cores"},
         "rerun": "python train_optimized.py --config r/config.toml"}  # fmt: skip
    assert closing_lines(s, Path("r")) == [
        "[plainloop] done: 9 steps (4 since the resume) in 1.2 s, 320 samples/s, 1 skipped, verdict: contended: "
        "other processes used 1.1 of 2 CPU cores",
        "[plainloop] run directory: r (re-run: python train_optimized.py --config r/config.toml)",
    ]
    bare = closing_lines({"steps": 2, "train_time_s": 0.0, "samples_per_s": None}, None)
    assert bare[0].endswith("in 0.0 s, ? samples/s, 0 skipped, verdict: not judged")


BUILDER = """
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer import Task


def build(cfg) -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    y = x.sum(1, keepdim=True)
    return Task("mine", nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)), TensorDataset(x, y),
                TensorDataset(x[:16], y[:16]))
"""


def test_the_command_line_prints_the_closing_lines_once_and_a_user_task_gets_one_thread(tmp_path, monkeypatch, capsys):
    import tasks
    import train_optimized as cli

    (tmp_path / "mytask.py").write_text(BUILDER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    builders = dict(tasks.TASK_BUILDERS)
    monkeypatch.setattr(tasks, "TASK_BUILDERS", builders)
    monkeypatch.setattr(tasks, "USER_MODULES", dict(tasks.USER_MODULES))
    monkeypatch.setattr(cli, "TASK_BUILDERS", builders)
    torch.set_num_threads(2)  # the one_thread fixture puts its own value back
    argv = ["--task", "mytask.py:build", "--max_steps", "2", "--batch_size", "16", "--run_name", "r",
            "--no-progress_bar", "--no-plots", "--output_dir", "runs"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("[plainloop] done: ") == 1 and out.count("[plainloop] run directory: ") == 1
    lines = out.strip().splitlines()
    assert lines[-2].startswith("[plainloop] done: 2 steps in ")
    assert (
        lines[-1].startswith("[plainloop] run directory: runs/r (re-run: ")
        and "--config runs/r/config.toml" in lines[-1]
    )
    assert "[plainloop] threads: 2 -> 1 torch thread: a model of 21 parameters on a CPU gains nothing" in out
    assert torch.get_num_threads() == 1
    monkeypatch.delitem(sys.modules, "mytask", raising=False)


# ------------------------------------------------------------------------------------------- threads on a CPU
def test_a_small_model_on_a_cpu_gets_one_thread_unless_num_threads_is_given(tmp_path, capsys):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    torch.set_num_threads(2)
    assert cpu_threads(None, cuda, 10) is None and torch.get_num_threads() == 2  # a GPU run: torch's own
    assert cpu_threads(None, cpu, SMALL_MODEL) is None and torch.get_num_threads() == 2  # a large model: torch's
    assert cpu_threads(2, cpu, 10) is None and torch.get_num_threads() == 2  # given: kept
    note = cpu_threads(None, cpu, 321)
    assert torch.get_num_threads() == 1 and note is not None
    assert note.startswith("threads: 2 -> 1 torch thread: a model of 321 parameters on a CPU")
    assert "--num_threads 2" in note  # how to keep torch's own
    assert cpu_threads(3, cpu, 321) == "threads: 1 -> 3 torch intra-op thread(s) (num_threads)"
    # through the Trainer: the README's example, and one with num_threads given
    torch.set_num_threads(2)
    Trainer(toy_config(tmp_path, epochs=1), small_task()).fit()
    assert torch.get_num_threads() == 1 and "threads: 2 -> 1 torch thread: a model of" in capsys.readouterr().out
    torch.set_num_threads(2)
    Trainer(toy_config(tmp_path, epochs=1, run_name="n", num_threads=2), small_task()).fit()
    assert torch.get_num_threads() == 2 and "threads:" not in capsys.readouterr().out


def _contended_cpu(**kw: object) -> dict:
    """A monitor summary of a CPU run whose threads waited for cores that other processes held."""
    return {"cpu_percent_mean": 98.0, "cpu_others_cores_mean": 1.1, "process_cpu_percent_mean": 80.0,
            "cpu_count_logical": 2, "cpu_wait_frac": 0.4, "cpu_wait_threads_mean": 0.6, "data_wait_frac": 0.01,
            "iter_time_s": {"p50": 0.01, "p90": 0.02}, **kw}  # fmt: skip


def test_a_contended_verdict_names_num_threads_1_when_the_run_used_more_threads():
    two = diagnose(_contended_cpu(), device_type="cpu", step_stats={"num_workers": 0, "torch_threads": 2})
    assert two["verdict"] == "contended"
    assert two["advice"].startswith("Train with one torch thread: --num_threads 1 (TrainConfig(num_threads=1))")
    one = diagnose(_contended_cpu(), device_type="cpu", step_stats={"num_workers": 0, "torch_threads": 1})
    assert one["verdict"] == "contended" and "num_threads" not in one["advice"]
