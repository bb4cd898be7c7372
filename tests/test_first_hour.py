"""What a new user meets in the first hour: run files others can read, defaults that fit a short run, accuracy
and top-k metrics, top-k checkpoints, a model summary, and the CLI's measuring tools from the Python API."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.helpers import metric_rows, toy_config
from trainer import Task, Trainer


def regression(n: int = 128, seed: int = 0) -> Task:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x.sum(1, keepdim=True)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return Task("toy", model, TensorDataset(x, y), TensorDataset(x[:32], y[:32]))


# ------------------------------------------------------------------------------------------- run files and the umask
@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX file modes")
@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_run_files_follow_the_umask(tmp_path, mask, mode):
    """A teammate on a shared disk reads a run's files when the umask lets them (checkpoints were 0600 before)."""
    old = os.umask(mask)
    try:
        Trainer(toy_config(tmp_path, epochs=1), regression()).fit()
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    names = {p.name for p in files}
    assert {"last.pt", "best.pt", "config.toml", "summary.json", "metrics.jsonl"} <= names
    wrong = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files if stat.S_IMODE(p.stat().st_mode) != mode}
    assert not wrong, f"umask {oct(mask)}: expected {oct(mode)}, got {wrong}"


# ------------------------------------------------------------------------------------------- validation cadence
def test_auto_validation_interval_rule():
    from trainer.config import AUTO_VALIDATIONS, validation_every

    assert validation_every(None, 5) == (1, None)  # a short run validates every epoch
    assert validation_every(None, AUTO_VALIDATIONS) == (1, None)
    every, note = validation_every(None, 3 * AUTO_VALIDATIONS + 1)
    assert every == 4 and note is not None and "every 4 epochs" in note and "auto" in note
    every, note = validation_every(20, 60)  # given: kept, and said
    assert every == 20 and note is not None and "every 20 epochs" in note and "--validation_interval 1" in note
    assert validation_every(20, 1) == (20, None)  # one epoch: it is the last, which always validates


def test_a_short_run_validates_every_epoch_by_default(tmp_path, capsys):
    cfg = toy_config(tmp_path, epochs=5, validation_interval=None)
    assert cfg.validation_interval is None
    Trainer(cfg, regression()).fit()
    vals = [r for r in metric_rows(tmp_path / "run") if r["kind"] == "val"]
    assert [r["epoch"] for r in vals] == [1, 2, 3, 4, 5]
    assert "[plainloop] validation: every" not in capsys.readouterr().out


def test_a_long_run_of_short_epochs_validates_less_and_says_so(tmp_path, capsys, monkeypatch):
    import trainer.config

    monkeypatch.setattr(trainer.config, "AUTO_VALIDATIONS", 4)  # the rule at a small scale: 10 epochs, every 3rd
    Trainer(toy_config(tmp_path, epochs=10, validation_interval=None), regression(n=32)).fit()
    vals = [r["epoch"] for r in metric_rows(tmp_path / "run") if r["kind"] == "val"]
    assert vals == [3, 6, 9, 10]  # and the last epoch
    out = capsys.readouterr().out
    assert "[plainloop] validation: every 3 epochs and the last (auto: about 4 validations in 10 epochs)" in out


# ------------------------------------------------------------------------------------------- metrics=
def test_accuracy_and_top_k_on_fixed_scores():
    from trainer import accuracy, top_k_accuracy

    out = torch.tensor([[3.0, 1.0, 0.0], [0.0, 1.0, 2.0], [1.0, 3.0, 2.0], [2.0, 0.0, 1.0]])
    y = torch.tensor([0, 1, 2, 1])
    assert accuracy(out, y).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert top_k_accuracy(2)(out, y).tolist() == [1.0, 1.0, 1.0, 0.0]
    assert top_k_accuracy(9)(out, y).tolist() == [1.0] * 4  # k beyond the classes: every target is in
    with pytest.raises(ValueError, match=r"top_k_accuracy\(0\): k must be a whole number >= 1"):
        top_k_accuracy(0)


def classifier(metrics, n: int = 96) -> Task:
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # 3 classes
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    return Task("cls", model, TensorDataset(x, y), TensorDataset(x[:40], y[:40]),
                loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]), metrics=metrics,
                monitor_metric="val_acc", monitor_mode="max")  # fmt: skip


def test_metrics_are_scored_beside_the_loss_with_one_read(tmp_path, monkeypatch):
    from trainer import accuracy, top_k_accuracy

    task = classifier({"acc": accuracy, "top2": top_k_accuracy(2)})
    trainer = Trainer(toy_config(tmp_path, epochs=2, batch_size=16), task)
    reads = []
    real = torch.Tensor.tolist

    def counted(t):
        reads.append(t.shape)
        return real(t)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    monkeypatch.setattr(torch.Tensor, "item", lambda t: pytest.fail("a per-batch .item() in evaluation"))
    scores = trainer.evaluate("val")
    monkeypatch.undo()
    assert set(scores) == {"val_loss", "val_acc", "val_top2"} and len(reads) == 1  # one read for the split
    model, (x, y) = task.model, task.val_set.tensors
    with torch.no_grad():
        out = model(x)
    assert scores["val_acc"] == pytest.approx((out.argmax(1) == y).float().mean().item())
    assert scores["val_top2"] == pytest.approx((out.topk(2).indices == y[:, None]).any(1).float().mean().item())
    summary = trainer.fit()
    assert "val_acc" in summary["final_metrics"] and list(summary["best"]) == ["val_acc"]


def test_a_test_split_given_to_a_plain_task_is_scored_at_the_end(tmp_path):
    """Task(test_set=...) with plainloop's own evaluation: fit() ends with test_loss and test_<metric> in the
    summary, a "test" row in metrics.jsonl and a [test] line (they were scored only with an evaluate_fn)."""
    from trainer import accuracy

    task = classifier({"acc": accuracy})
    task.test_set = task.val_set
    lines: list[str] = []
    summary = Trainer(toy_config(tmp_path, epochs=2, batch_size=16), task, log=lines.append).fit()
    final = summary["final_metrics"]
    assert {"test_loss", "test_acc"} <= set(final) and 0 <= final["test_acc"] <= 1
    rows = [r for r in metric_rows(Path(summary["run_dir"])) if r["kind"] == "test"]
    assert len(rows) == 1 and rows[0]["test_acc"] == final["test_acc"]
    assert any(line.startswith("[test] ") and "test_acc=" in line for line in lines)


def test_metrics_with_an_own_evaluation_or_a_bad_entry_are_one_line(tmp_path):
    from trainer import accuracy

    task = classifier({"acc": accuracy})
    task.evaluate_fn = lambda m, split, d: {f"{split}_x": 1.0}
    with pytest.raises(ValueError, match=r"metrics=\.\.\.\) scores plainloop's own evaluation"):
        Trainer(toy_config(tmp_path), task)
    with pytest.raises(ValueError, match=r"Task\(metrics=\.\.\.\): 'acc': 3 is not a function"):
        Trainer(toy_config(tmp_path), classifier({"acc": 3}))


# ------------------------------------------------------------------------------------------- --summary
def test_summary_prints_each_layer_with_its_output_shape_and_parameters(tmp_path, capsys):
    Trainer(toy_config(tmp_path, epochs=1, summary=True), regression()).fit()
    out = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[plainloop] ")]
    head = next(i for i, line in enumerate(out) if "| Name" in line)
    rows = [[c.strip() for c in line.removeprefix("[plainloop] ").split(" | ")] for line in out[head + 2 : head + 5]]
    assert rows == [
        ["0", "0", "Linear", "144", "[1, 16]"],
        ["1", "1", "ReLU", "0", "[1, 16]"],
        ["2", "2", "Linear", "17", "[1, 1]"],
    ]
    assert "161 trainable, 0 non-trainable parameters" in out[head + 5]


def test_summary_feeds_a_forward_that_takes_targets_its_target_too(tmp_path, capsys):
    """nanoGPT's forward(idx, targets): the summary's forward gets the sample's target, so the shapes are known."""

    class TakesTargets(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(8, 1)

        def forward(self, x, targets):
            out = self.body(x)
            return out, nn.functional.mse_loss(out, targets)

    task = regression()
    task.model = TakesTargets()
    Trainer(toy_config(tmp_path, epochs=1, summary=True), task).fit()
    out = capsys.readouterr().out
    assert "| body | Linear | 9      | [1, 1]" in out and "forward of one training sample failed" not in out


def test_summary_leaves_the_run_unchanged(tmp_path):
    """The summary's forward runs in eval mode with the RNG restored: weights after training are the same."""
    nets = []
    for flag in (False, True):
        task = regression()
        task.model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.BatchNorm1d(16), nn.Linear(16, 1))
        torch.manual_seed(0)
        task.model.apply(lambda m: m.reset_parameters() if hasattr(m, "reset_parameters") else None)
        Trainer(toy_config(tmp_path, epochs=1, summary=flag, run_name=f"s{flag}"), task).fit()
        nets.append(task.model.state_dict())
    assert all(torch.equal(nets[0][k], nets[1][k]) for k in nets[0])


def test_summary_is_a_flag():
    import train_optimized

    assert vars(train_optimized.build_parser().parse_args(["--summary"]))["summary"] is True


# ------------------------------------------------------------------------------------------- save_top_k
def scripted_scores(values: dict[int, float]) -> tuple[Task, list]:
    """A task whose validation at step s scores values[s] (one step per epoch), whatever the weights."""
    holder: list = []
    task = regression(n=32)
    task.evaluate_fn = lambda m, split, d: {f"{split}_loss": values[holder[0].progress.step]}
    return task, holder


def kept(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("epoch=*.pt"))


def test_save_top_k_keeps_the_k_best_checkpoints_across_a_resume(tmp_path):
    values = {1: 5.0, 2: 3.0, 3: 4.0, 4: 1.0, 5: 2.0}
    task, holder = scripted_scores(values)
    t = Trainer(toy_config(tmp_path, max_steps=3, save_top_k=2), task)
    holder.append(t)
    t.fit()
    run = tmp_path / "run"
    assert kept(run) == ["epoch=2-step=2.pt", "epoch=3-step=3.pt"]  # 5.0 fell out when 4.0 came
    task, holder = scripted_scores(values)
    t = Trainer(toy_config(tmp_path, max_steps=5, save_top_k=2, resume=str(run)), task)
    holder.append(t)
    t.fit()
    assert kept(run) == ["epoch=4-step=4.pt", "epoch=5-step=5.pt"]  # the resumed run knew 3.0 and 4.0 were kept
    assert [e["value"] for e in t.best.top] == [1.0, 2.0]
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=False)
    top = torch.load(run / "checkpoints" / "epoch=4-step=4.pt", weights_only=False)
    assert best["step"] == top["step"] == 4  # best.pt stays the best


def test_save_top_k_forgets_a_kept_file_that_is_gone(tmp_path):
    """A file removed after the checkpoint a run resumes from was written (a crash after the removal, or by hand)
    leaves no entry without a file: the list is refilled from the validations that follow."""
    values = {1: 5.0, 2: 3.0, 3: 4.0, 4: 6.0, 5: 7.0}
    task, holder = scripted_scores(values)
    t = Trainer(toy_config(tmp_path, max_steps=3, save_top_k=2), task)
    holder.append(t)
    t.fit()
    run = tmp_path / "run"
    (run / "checkpoints" / "epoch=2-step=2.pt").unlink()
    task, holder = scripted_scores(values)
    t = Trainer(toy_config(tmp_path, max_steps=5, save_top_k=2, resume=str(run)), task)
    holder.append(t)
    t.fit()
    assert kept(run) == ["epoch=3-step=3.pt", "epoch=4-step=4.pt"]
    assert [e["name"] for e in t.best.top] == ["epoch=3-step=3.pt", "epoch=4-step=4.pt"]


def test_save_top_k_ranks_by_the_monitor_mode(tmp_path):
    from trainer.evaluation import BestTracker

    b = BestTracker("val_acc", "max", keep=2)
    assert b.rank({"val_acc": 0.5}, "a", 1) == (True, [])
    assert b.rank({"val_acc": 0.7}, "b", 2) == (True, [])
    assert b.rank({"val_acc": 0.6}, "c", 3) == (True, ["a"])
    assert b.rank({"val_acc": 0.1}, "d", 4) == (False, ["d"])
    assert b.rank({"val_acc": float("nan")}, "e", 5) == (False, [])
    assert [e["name"] for e in b.top] == ["b", "c"]
    assert BestTracker("val_loss", "min").rank({"val_loss": 1.0}, "x", 1) == (False, [])  # k = 1: best.pt alone


# ------------------------------------------------------------------------------------------- the tools from Python
def test_measuring_tools_give_a_python_run_the_clis_plots_verdict_and_last_line(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from utils.tools import measuring_tools

    summary = Trainer(toy_config(tmp_path, epochs=2), regression(), callbacks=measuring_tools()).fit()
    assert summary["verdict"]["verdict"] not in ("", None, "unknown")  # the monitor sampled the run
    assert summary["monitor"]  # a TrainingMonitor replaced the engine's do-nothing one
    assert (tmp_path / "run" / "plots" / "curves.png").is_file()
    lines = capsys.readouterr().out.strip().splitlines()  # the engine's done and run directory lines come last
    assert lines[-3].startswith("[plainloop] plots: ") and lines[-2].startswith("[plainloop] done: ")
    assert "verdict: " in lines[-2] and "not judged" not in lines[-2]
    assert lines[-1] == f"[plainloop] run directory: {tmp_path / 'run'}"


def test_measuring_tools_switches_off_and_a_monitor_given_is_kept(tmp_path, capsys):
    from utils.tools import MonitorTool, measuring_tools

    tools = measuring_tools(plots=False, verdict=False)
    assert not any(isinstance(t, MonitorTool) for t in tools)
    summary = Trainer(toy_config(tmp_path, epochs=1), regression(), callbacks=tools).fit()
    assert "verdict" not in summary and not (tmp_path / "run" / "plots").exists()
    assert capsys.readouterr().out.strip().splitlines()[-2].endswith("verdict: not judged")

    class Mine:
        def start_monitoring(self): ...
        def log_iteration(self, *a, **k): ...
        def stop_monitoring(self): ...
        def get_summary(self):
            return {"mine": 1}

    mine = Mine()
    t = Trainer(toy_config(tmp_path, epochs=1, run_name="m"), regression(), callbacks=measuring_tools(plots=False),
                monitor=mine)  # fmt: skip
    assert t.fit()["monitor"] == {"mine": 1} and t.monitor is mine


def test_measuring_tools_system_report_after_the_run(tmp_path, capsys):
    from utils.tools import measuring_tools

    task = regression()
    tools = measuring_tools(plots=False, system_report=True, report_steps=2, report_repeats=1)
    t = Trainer(toy_config(tmp_path, epochs=1), task, callbacks=tools)
    summary = t.fit()
    trained = {k: v.clone() for k, v in task.model.state_dict().items()}
    report = tmp_path / "run" / "report.md"
    assert summary["system_report"] == str(report) and report.is_file() and "verdict" in report.read_text().lower()
    assert not (tmp_path / "run" / "trials").exists()  # the trial runs are removed
    final = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(final[k], trained[k]) for k in trained)  # the trained weights are back after the trials
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-3] == f"[plainloop] system report: {report}" and lines[-2].startswith("[plainloop] done: ")


class _Dicts(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.ones(3), "y": torch.ones(1)}


class _IntLabels(_Dicts):
    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:  # type: ignore[override]
        return torch.ones(3), i % 2


def test_the_default_loss_refuses_what_it_cannot_score_in_one_line(tmp_path):
    """Dict samples and Python class labels are refused before the run directory exists; an output whose shape
    differs from the targets' (MSE would broadcast it and learn nothing) at the first step, naming both shapes."""
    for ds, match in ((_Dicts(), r"samples are dicts \(keys \['x', 'y'\]\).*Task\(loss_fn"),
                      (_IntLabels(), r"targets are torch.int64 \(class labels\?\)")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            Trainer(toy_config(tmp_path, epochs=1, batch_size=4), Task("t", nn.Linear(3, 1), ds, None))
    assert not (tmp_path / "run").exists()
    x = torch.randn(16, 3)
    flat = TensorDataset(x, x.sum(1))  # targets (N,) against outputs (N, 1)
    with pytest.raises(ValueError, match=r"output \(8, 1\) and the targets \(8,\) differ in shape"):
        Trainer(toy_config(tmp_path, epochs=1, batch_size=8), Task("t", nn.Linear(3, 1), flat, None)).fit()
    fixed = TensorDataset(x, x.sum(1, keepdim=True))
    Trainer(toy_config(tmp_path, run_name="ok", epochs=1, batch_size=8), Task("t", nn.Linear(3, 1), fixed, None)).fit()
