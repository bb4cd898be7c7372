"""Loggers (trainer/extras/loggers.py): CSV and W&B receive the rows of metrics.jsonl and the configuration."""

from __future__ import annotations

import csv
import json
import sys
import types

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.helpers import cut_short, metric_rows, toy_config
from trainer.extras.loggers import WANDB_MISSING, CSVLogger, WandbLogger, parse_logger_names
from trainer.loop import Trainer
from trainer.task import Task

pytestmark = pytest.mark.usefixtures("one_thread")


def toy_task() -> Task:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def evaluate(m, split, device):
        xs, ys = (x[:32], y[:32]) if split == "val" else (x[32:64], y[32:64])
        return {f"{split}_mse": float((m(xs.to(device)) - ys.to(device)).pow(2).mean())}

    held_out = TensorDataset(x[:32], y[:32])
    return Task("toy", model, TensorDataset(x, y), held_out, held_out, evaluate_fn=evaluate, monitor_metric="val_mse")


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def same_rows(csv_rows, jsonl_rows):
    assert len(csv_rows) == len(jsonl_rows)
    for c, j in zip(csv_rows, jsonl_rows):
        assert set(k for k, v in c.items() if v != "") == set(k for k, v in j.items() if v is not None)
        for k, v in j.items():
            if isinstance(v, float):
                assert float(c[k]) == pytest.approx(v, rel=1e-12), k
            elif isinstance(v, int) and not isinstance(v, bool):
                assert int(c[k]) == v, k
            elif isinstance(v, str):
                assert c[k] == v, k


def test_parse_logger_names():
    assert parse_logger_names("csv, WandB,csv") == ("csv", "wandb")
    assert parse_logger_names("jsonl") == () and parse_logger_names(None) == ()
    assert parse_logger_names(["tensorboard", "csv"]) == ("tensorboard", "csv")
    with pytest.raises(ValueError, match=r"--logger csv,mlflow: unknown logger 'mlflow'.*csv, tensorboard, wandb"):
        parse_logger_names("csv,mlflow")


def test_csv_holds_the_rows_of_metrics_jsonl_and_the_config(tmp_path):
    t = Trainer(toy_config(tmp_path, epochs=2, norm_every=2), toy_task(), callbacks=[CSVLogger()])
    t.fit()
    rows = metric_rows(t.run_dir)
    assert {r["kind"] for r in rows} >= {"train", "val", "norm"}  # the header grew twice during the run
    got = read_csv(t.run_dir / "metrics.csv")
    same_rows(got, rows)
    assert list(got[0])[:3] == ["kind", "step", "epoch"]
    config = {r["key"]: r["value"] for r in read_csv(t.run_dir / "config.csv")}
    assert config["effective.batch_size"] == "32" and config["task.name"] == "toy"


def test_csv_after_a_resume_matches_the_rolled_back_metrics(tmp_path):
    first = Trainer(toy_config(tmp_path, epochs=4), toy_task(), callbacks=[CSVLogger()])
    cut_short(first, max_epochs=2)  # interrupted after epoch 2
    first.fit()
    run_dir = first.run_dir
    # a killed process wrote rows after the checkpoint: the resume trains those steps again
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"kind": "train", "step": 10**6, "epoch": 3, "loss": 1.0, "stray": 1}) + "\n")
    second = Trainer(toy_config(tmp_path, epochs=4, resume=str(run_dir)), toy_task(), callbacks=[CSVLogger()])
    second.fit()
    rows = metric_rows(run_dir)
    assert all(r["step"] != 10**6 for r in rows) and max(r["step"] for r in rows) == second.step
    got = read_csv(run_dir / "metrics.csv")
    same_rows(got, rows)
    assert "stray" not in got[0]


class FakeRun:
    def __init__(self, **kw):
        self.kw, self.id, self.logged, self.summary, self.metrics, self.finished = kw, "abc123", [], {}, [], False

    def define_metric(self, name, **kw):
        self.metrics.append((name, kw))

    def log(self, data):
        self.logged.append(dict(data))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch, tmp_path):
    mod = types.ModuleType("wandb")
    mod.runs = []

    def init(**kw):
        mod.runs.append(FakeRun(**kw))
        return mod.runs[-1]

    mod.init = init
    monkeypatch.setitem(sys.modules, "wandb", mod)
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    return mod


def test_wandb_gets_config_rows_and_test_scores(tmp_path, fake_wandb):
    lines = []
    t = Trainer(toy_config(tmp_path, epochs=2), toy_task(), callbacks=[WandbLogger(project="p")], log=lines.append)
    summary = t.fit()
    run = fake_wandb.runs[0]
    assert run.kw["dir"] == str(t.run_dir) and run.kw["name"] == "run" and run.kw["project"] == "p"
    assert run.kw["config"]["effective"]["batch_size"] == 32 and run.kw["config"]["task"]["name"] == "toy"
    # no API key and no WANDB_MODE: offline, said once
    assert run.kw["mode"] == "offline" and sum("logging offline" in m for m in lines) == 1
    rows = [r for r in metric_rows(t.run_dir) if r["kind"] in ("train", "val", "norm")]
    assert len(run.logged) == len(rows)
    for data, row in zip(run.logged, rows):
        assert data["trainer/step"] == row["step"]
        if row["kind"] == "val":
            assert data["val/mse"] == row["val_mse"]
        else:
            assert data["train/loss"] == row["loss"] and data["train/lr"] == row["lr"]
    assert run.summary["test/mse"] == summary["final_metrics"]["test_mse"]
    assert run.finished and (t.run_dir / "wandb_id").read_text() == "abc123"
    assert ("*", {"step_metric": "trainer/step"}) in run.metrics


def test_wandb_resume_continues_the_same_run(tmp_path, fake_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    first = Trainer(toy_config(tmp_path, epochs=3), toy_task(), callbacks=[WandbLogger()])
    cut_short(first, max_epochs=1)
    first.fit()
    Trainer(toy_config(tmp_path, epochs=3, resume=str(first.run_dir)), toy_task(), callbacks=[WandbLogger()]).fit()
    a, b = fake_wandb.runs
    assert a.kw["id"] is None and b.kw["id"] == "abc123" and b.kw["resume"] == "allow"
    assert b.kw["mode"] is None  # WANDB_MODE is wandb's own to read


def test_wandb_missing_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ImportError) as e:
        WandbLogger()
    assert str(e.value) == WANDB_MISSING and "pip install wandb" in WANDB_MISSING


def test_wandb_offline_writes_into_the_run_dir_without_network(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))  # nothing written outside tmp_path
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    t = Trainer(toy_config(tmp_path, epochs=1), toy_task(), callbacks=[WandbLogger(project="plainloop-test")])
    summary = t.fit()
    runs = list((t.run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(p.stat().st_size > 0 for p in runs[0].glob("run-*.wandb"))
    assert summary["wandb"]["id"] == (t.run_dir / "wandb_id").read_text()
    assert json.loads((t.run_dir / "summary.json").read_text())["wandb"]["id"] == summary["wandb"]["id"]
