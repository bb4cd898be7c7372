"""utils.plot: curves, throughput and SST maps are written as valid PNGs from a realistic run directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from utils.plot import main, plot_run, read_metrics  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run_dir(run: Path, with_maps: bool = True, seed: int = 0) -> Path:
    """A run directory like the engine writes: metrics.jsonl, summary.json and (SST) test_month.npz."""
    rng = np.random.default_rng(seed)
    run.mkdir(parents=True, exist_ok=True)
    rows = []
    steps_per_epoch, t = 40, 0.0
    for epoch in range(6):
        for i in range(0, steps_per_epoch, 5):  # logged every LOG_EVERY=5 steps
            step = epoch * steps_per_epoch + i
            loss = 0.9 * np.exp(-step / 80) + 0.08 + 0.02 * rng.standard_normal()
            wait = 0.45 if epoch == 0 else 0.06 + 0.03 * rng.random()  # first epoch: cold page cache
            sps = (180 if epoch == 0 else 330) * (1 + 0.05 * rng.standard_normal())
            t += 5 * 16 / sps
            rows.append(
                {
                    "kind": "train",
                    "step": step,
                    "epoch": epoch,
                    "loss": float(loss),
                    "lr": 1e-3,
                    "samples_per_s": float(sps),
                    "data_wait_frac": float(wait),
                    "time": t,
                }
            )
        vstep = (epoch + 1) * steps_per_epoch
        rows.append(
            {
                "kind": "val",
                "step": vstep,
                "epoch": epoch,
                "val_loss": float(0.85 * np.exp(-vstep / 90) + 0.1),
                "rmse": float(1.6 * np.exp(-vstep / 100) + 0.45),
                "acc": float(0.9 - 0.5 * np.exp(-vstep / 70)),
            }
        )
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run / "summary.json").write_text(json.dumps({"task": "sst", "samples_per_s": 330.0}))
    if with_maps:
        lats = np.linspace(89, -89, 90)  # ERA5 order: north to south
        lons = np.arange(0, 360, 2.0)
        la, lo = np.meshgrid(lats, lons, indexing="ij")
        truth = 28 * np.cos(np.deg2rad(la)) ** 2 - 1.5 + 1.2 * np.sin(np.deg2rad(2 * lo))
        land = ((lo > 10) & (lo < 50) & (la > -35) & (la < 35)) | (
            (lo > 250) & (lo < 300) & (la > 10) & (la < 60)
        )
        land |= la < -72
        truth = np.where(land, np.nan, truth)
        pred = (
            truth
            + 0.4 * np.sin(np.deg2rad(3 * lo)) * np.cos(np.deg2rad(la))
            + 0.1 * rng.standard_normal(truth.shape)
        )
        np.savez(
            run / "test_month.npz",
            truth_c=truth.astype("f4"),
            pred_c=pred.astype("f4"),
            lats=lats,
            lons=lons,
            mask=~land,
            label="2020-07",
        )
    return run


def _is_png(p: Path) -> bool:
    from PIL import Image

    if p.read_bytes()[:8] != PNG_MAGIC:
        return False
    with Image.open(p) as im:
        im.verify()
    with Image.open(p) as im:
        return im.size[0] > 200 and im.size[1] > 200


def test_plot_run_writes_valid_pngs(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run")
    paths = plot_run(run)
    names = sorted(p.name for p in paths)
    assert names == ["curves.png", "test_month_maps.png", "throughput.png"]
    for p in paths:
        assert p.parent == run / "plots"
        assert _is_png(p), p


def test_plot_without_maps_and_metric_parsing(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", with_maps=False)
    train, val = read_metrics(run / "metrics.jsonl")
    assert len(train) == 48 and len(val) == 6
    assert sorted(p.name for p in plot_run(run)) == ["curves.png", "throughput.png"]


def test_bad_inputs_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot_run(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot_run(empty)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 1.0}\n{oops\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        plot_run(bad)
    assert main([str(bad)]) == 1


def test_cli_module(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", with_maps=False)
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run(
        [sys.executable, "-m", "utils.plot", str(run)], cwd=root, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert "curves.png" in res.stdout and (run / "plots" / "throughput.png").exists()


def test_missing_matplotlib_exits_2(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", with_maps=False)
    root = Path(__file__).resolve().parents[1]
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"  # import of a None module raises ImportError
        "from utils.plot import main; raise SystemExit(main([sys.argv[1]]))"
    )
    res = subprocess.run([sys.executable, "-c", code, str(run)], cwd=root, capture_output=True, text=True)
    assert res.returncode == 2
    assert "pip install matplotlib" in res.stderr
