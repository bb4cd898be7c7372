"""TensorBoardLogger: the event file read back has the loop's scalars, the test scores, the text and the figure."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("matplotlib")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from utils.tensorboard_logger import MISSING_MESSAGE, TensorBoardLogger  # noqa: E402

T0 = 1_790_000_000.0  # the loop's rows carry Unix wall-clock times


def _rows() -> list[dict]:
    rows = []
    for step in (5, 10, 15, 20):
        r = {"kind": "train", "step": step, "epoch": 1 + step // 10, "loss": 1.0 / step, "lr": 1e-3 * step / 20,
             "samples_per_s": 200.0 + step, "data_wait_frac": 0.01, "time": T0 + step, "skipped_steps": 0}  # fmt: skip
        if step == 20:
            r["grad_norm"] = 0.8
        rows.append(r)
        if step == 10:  # a NORM_EVERY read-back between two log points
            rows.append({"kind": "norm", "step": 12, "grad_norm": 1.5})
    rows.append({"kind": "val", "step": 20, "epoch": 2, "val_loss": 0.2, "val_rmse_c": 0.07, "val_acc": 0.95,
                 "val_persistence_rmse_c": 0.55, "val_climatology_rmse_c": 0.24, "time": T0 + 21})  # fmt: skip
    rows.append({"kind": "checkpoint", "name": "last.pt", "step": 20, "path": "checkpoints/last.pt"})
    return rows


def _run_dir(tmp_path: Path, with_npz: bool) -> Path:
    run = tmp_path / "era5-run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"effective": {"batch_size": 32, "num_workers": 0}}))
    if with_npz:
        lats, lons = np.linspace(-60, 60, 13), np.arange(0, 360, 10.0)
        clim = 20 + 5 * np.cos(np.deg2rad(lats))[:, None] * np.ones(lons.size)
        truth = clim + np.sin(np.deg2rad(lons))[None, :]
        np.savez(run / "test_month.npz", truth_c=truth, pred_c=truth + 0.05, clim_c=clim, lats=lats, lons=lons,
                 mask=np.ones_like(truth, bool), year=np.int64(2019), month=np.int64(6))  # fmt: skip
    return run


def _read(log_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_event_file_has_the_tags(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, with_npz=True)
    trainer = types.SimpleNamespace(run_dir=run)
    tb = TensorBoardLogger()
    tb.on_fit_start(trainer)
    for row in _rows():
        tb.on_log(trainer, row)
    summary = {"steps": 20, "final_metrics": {"val_rmse_c": 0.07, "test_rmse_c": 0.068, "test_persistence_rmse_c": 0.55},
               "verdict": {"verdict": "contended", "headline": "contended: other processes used 1.1 of 2 CPU cores",
                           "evidence": ["the machine was 98% busy"], "advice": "measure again when idle"}}  # fmt: skip
    tb.on_fit_end(trainer, summary)
    assert tb.writer is None and summary["tensorboard"] == {"log_dir": str(run), "figure": "test/month_maps"}
    assert list(run.glob("events.out.tfevents.*")), "event files go into the run directory"

    acc = _read(run)
    tags = acc.Tags()
    assert set(tags["scalars"]) == {
        "train/loss", "train/lr", "train/samples_per_s", "train/data_wait_frac", "train/skipped_steps",
        "train/grad_norm", "val/loss", "val/rmse_c", "val/acc", "val/persistence_rmse_c", "val/climatology_rmse_c",
        "test/rmse_c", "test/persistence_rmse_c",
    }  # fmt: skip
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [5, 10, 15, 20]
    assert [e.value for e in loss] == pytest.approx([1 / 5, 1 / 10, 1 / 15, 1 / 20])
    assert [e.wall_time for e in loss] == pytest.approx([T0 + 5, T0 + 10, T0 + 15, T0 + 20])
    assert [(e.step, e.value) for e in acc.Scalars("train/grad_norm")] == [
        (12, 1.5),
        (20, pytest.approx(0.8)),
    ]
    assert acc.Scalars("val/rmse_c")[0].value == pytest.approx(0.07)
    assert acc.Scalars("test/rmse_c")[0].step == 20
    assert tags["images"] == ["test/month_maps"]
    img = acc.Images("test/month_maps")[0]
    assert img.width > 500 and img.height > 300 and img.step == 20
    assert {"config/text_summary", "verdict/text_summary", "events/text_summary"} <= set(tags["tensors"])
    verdict = acc.Tensors("verdict/text_summary")[0].tensor_proto.string_val[0].decode()
    assert verdict.startswith("**contended: other processes used 1.1 of 2 CPU cores**")
    events = acc.Tensors("events/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "last.pt" in events and events.startswith("step 20:")
    config = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"num_workers": 0' in config


def test_reid_rows_and_custom_scalars_layout(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, with_npz=False)
    trainer = types.SimpleNamespace(run_dir=run)
    tb = TensorBoardLogger(log_dir=tmp_path / "tb")
    tb.on_fit_start(trainer)
    tb.on_log(trainer, {"kind": "train", "step": 50, "loss": 2.3, "lr": 8e-4, "time": 12.5})  # perf-counter time
    tb.on_log(trainer, {"kind": "val", "step": 96, "epoch": 3, "rgb2ir_mAP": 0.17, "rgb2ir_rank1": 0.13,
                        "ir2rgb_mAP": 0.14, "ir2rgb_rank1": 0.12, "val_loss": 1.5, "raw_val_loss": 1.6})  # fmt: skip
    summary: dict = {"steps": 96}
    tb.on_fit_end(trainer, summary)
    assert "figure" not in summary["tensorboard"]  # no test_month.npz: no figure, no error
    acc = _read(tmp_path / "tb")
    tags = set(acc.Tags()["scalars"])
    assert {"val/rgb2ir_mAP", "val/ir2rgb_mAP", "val/rgb2ir_rank1", "val/ir2rgb_rank1"} <= tags
    assert {"val/loss", "val/raw_loss"} <= tags and "val/raw_val_loss" not in tags  # the EMA's raw scores
    assert acc.Scalars("train/loss")[0].wall_time > 1e9  # a non-Unix "time" is replaced by the write time
    layout = acc.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0]
    assert b"val/rgb2ir_mAP" in layout and b"val/ir2rgb_mAP" in layout


def test_missing_tensorboard_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` now raises ImportError
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    with pytest.raises(ImportError) as e:
        TensorBoardLogger()
    assert str(e.value) == MISSING_MESSAGE
    assert "pip install tensorboard" in MISSING_MESSAGE and "`tensorboard` package" in MISSING_MESSAGE


def test_bad_flush_secs() -> None:
    with pytest.raises(ValueError, match="flush_secs=0"):
        TensorBoardLogger(flush_secs=0)


def test_a_resume_purges_the_events_of_the_steps_it_redoes(tmp_path: Path) -> None:
    """Killed after step 20's rows but with last.pt at step 10: the resumed run's writer drops steps 11 and on
    (metrics.jsonl moves those rows aside), so TensorBoard shows each step once."""
    run = _run_dir(tmp_path, with_npz=False)
    first = TensorBoardLogger()
    first.on_fit_start(types.SimpleNamespace(run_dir=run, step=0))
    for step in (5, 10, 15, 20):
        first.on_log(None, {"kind": "train", "step": step, "loss": 1.0 / step, "time": T0 + step})
    first.writer.flush()  # killed here: no on_fit_end
    again = TensorBoardLogger()
    again.on_fit_start(types.SimpleNamespace(run_dir=run, step=10))  # resumed from last.pt at step 10
    for step in (15, 20, 25):
        again.on_log(None, {"kind": "train", "step": step, "loss": 2.0 / step, "time": T0 + 100 + step})
    again.on_fit_end(types.SimpleNamespace(run_dir=run), {"steps": 25})
    loss = _read(run).Scalars("train/loss")
    assert [e.step for e in loss] == [5, 10, 15, 20, 25]
    assert [e.value for e in loss] == pytest.approx([1 / 5, 1 / 10, 2 / 15, 2 / 20, 2 / 25])
