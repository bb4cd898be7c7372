"""utils.plot: curves, throughput and SST maps are written as valid PNGs from a realistic run directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from utils.metrics import weighted_rmse  # noqa: E402
from utils.plot import curves_figure, main, map_figure, plot_run, read_metrics  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run_dir(run: Path, with_maps: bool = True, seed: int = 0) -> Path:
    """An ERA5 run directory like the engine writes: metrics.jsonl (train rows, validation rows with the
    baselines), summary.json and test_month.npz with year, month and the target month's climatology."""
    rng = np.random.default_rng(seed)
    run.mkdir(parents=True, exist_ok=True)
    rows = []
    steps_per_epoch, t = 40, 1.7e9
    for epoch in range(1, 7):
        for i in range(5, steps_per_epoch + 1, 5):  # logged every LOG_EVERY=5 steps
            step = (epoch - 1) * steps_per_epoch + i
            loss = 0.9 * np.exp(-step / 80) + 0.08 + 0.02 * rng.standard_normal()
            wait = 0.45 if epoch == 1 else 0.06 + 0.03 * rng.random()  # first epoch: cold page cache
            sps = (180 if epoch == 1 else 330) * (1 + 0.05 * rng.standard_normal())
            t += 5 * 16 / sps
            lr = 1e-3 * min(1.0, step / 20) * (0.5 + 0.5 * np.cos(np.pi * step / 240))
            rows.append({"kind": "train", "step": step, "epoch": epoch, "loss": float(loss), "lr": float(lr),
                         "samples_per_s": float(sps), "data_wait_frac": float(wait), "time": t})  # fmt: skip
        vstep = epoch * steps_per_epoch
        rows.append(
            {
                "kind": "val",
                "step": vstep,
                "epoch": epoch,
                "val_loss": float(0.85 * np.exp(-vstep / 90) + 0.1),
                "val_rmse_c": float(0.3 * np.exp(-vstep / 100) + 0.06),
                "val_acc": float(0.95 - 0.5 * np.exp(-vstep / 70)),
                "val_persistence_rmse_c": 0.5394,
                "val_persistence_acc": 0.3888,
                "val_climatology_rmse_c": 0.1973,
                "val_climatology_acc": 0.0,
                "val_anomaly_persistence_rmse_c": 0.0873,
                "val_anomaly_persistence_acc": 0.895,
            }  # fmt: skip
        )
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run / "summary.json").write_text(json.dumps({"task": "era5", "best": {"val_loss": 0.16}}))
    if with_maps:
        np.savez(run / "test_month.npz", **month_arrays(rng))
    return run


def month_arrays(rng: np.random.Generator, clim: bool = True) -> dict[str, np.ndarray]:
    lats = np.linspace(89, -89, 90)  # ERA5 order: north to south
    lons = np.arange(0, 360, 2.0)
    la, lo = np.meshgrid(lats, lons, indexing="ij")
    clim_c = 28 * np.cos(np.deg2rad(la)) ** 2 - 1.5
    anomaly = 1.2 * np.exp(-(((lo - 200) / 20) ** 2) - (la / 8) ** 2)  # an El Niño-like warm tongue
    land = ((lo > 10) & (lo < 50) & (la > -35) & (la < 35)) | ((lo > 250) & (lo < 300) & (la > 10) & (la < 60))
    land |= la < -72
    truth = np.where(land, np.nan, clim_c + anomaly)
    pred = clim_c + 0.9 * anomaly + 0.05 * rng.standard_normal(truth.shape)
    d = {"truth_c": truth.astype("f4"), "pred_c": pred.astype("f4"), "lats": lats, "lons": lons, "mask": ~land,
         "label": np.array("test sample 18 (target month 6)"), "year": np.int64(2019), "month": np.int64(6)}  # fmt: skip
    if clim:
        d["clim_c"] = np.where(land, np.nan, clim_c).astype("f4")
        d["last_input_c"] = (clim_c + 0.5 * anomaly + 0.3).astype("f4")
    return d


def reid_rows(n_val: int) -> tuple[list[dict], list[dict]]:
    train = [{"kind": "train", "step": s, "epoch": s // 32 + 1, "loss": 3.0 - s / 1000, "lr": 1e-3,
              "samples_per_s": 60.0, "data_wait_frac": 0.01} for s in range(50, 1950, 50)]  # fmt: skip
    val = []
    for i in range(n_val):
        step = 1920 * (i + 1) // n_val
        m = {f"{d}_{k}": 0.1 + 0.3 * (i + 1) / n_val + off for d, off in (("rgb2ir", 0.02), ("ir2rgb", 0.0))
             for k in ("mAP", "rank1", "rank5", "rank10")}  # fmt: skip
        val.append({"kind": "val", "step": step, "epoch": step // 32, **m})
    return train, val


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
    assert main([str(bad)]) == 2  # a bad input: the command line's code
    (tmp_path / "model.pt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=r"model.pt is a file, not a run directory"):
        plot_run(tmp_path / "model.pt")


def test_cli_module(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "run", with_maps=False)
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-m", "utils.plot", str(run)], cwd=root, capture_output=True, text=True)
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


def _panels(fig: object) -> list:
    return [a for a in fig.axes if a.get_visible() and a.get_label() != "<colorbar>" and a.get_title()]


def _legend(ax: object) -> list[str]:
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg is not None else []


def test_era5_curves_have_units_baselines_and_lr(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    train, val = read_metrics(make_run_dir(tmp_path / "run", with_maps=False) / "metrics.jsonl")
    fig = curves_figure(train, val, "t", selection="val_loss", task="era5")
    axes = _panels(fig)
    assert [a.get_title() for a in axes] == ["loss", "validation RMSE", "validation ACC", "learning rate"]
    loss, rmse, acc, lr = axes
    assert _legend(loss) == ["train", "validation"]
    assert "°C" in rmse.get_ylabel()
    legend = _legend(rmse)
    assert legend[0].startswith("model: ") and "persistence: 0.5394 (off the axis)" in legend
    assert "climatology (calendar month): 0.1973" in legend and "anomaly persistence: 0.0873" in legend
    assert rmse.get_ylim()[0] == 0  # values that come near 0: the axis starts there
    assert "anomaly persistence: 0.8950" in _legend(acc)
    assert np.allclose(lr.get_lines()[0].get_ydata(), [r["lr"] for r in train])
    assert all(a.get_xlabel() == "optimizer step" for a in axes)
    plt.close(fig)


def test_scores_far_from_0_get_an_axis_that_tells_them_apart() -> None:
    """RMSEs of 0.3320 and 0.3340 (the model and its best baseline) on an axis from 0 would read as one line; the
    legend sits beside the panel, off the lines."""
    import matplotlib.pyplot as plt

    train = [{"kind": "train", "step": s, "epoch": s, "loss": 0.36} for s in range(1, 6)]
    val = [
        {"kind": "val", "step": s, "epoch": s, "val_loss": 0.38, "val_rmse_c": 0.3330 - 0.0002 * s,
         "val_damped_persistence_rmse_c": 0.3340, "val_persistence_rmse_c": 0.6336}
        for s in range(1, 6)
    ]  # fmt: skip
    fig = curves_figure(train, val, "t", task="era5")
    rmse = _panels(fig)[1]
    lo, hi = rmse.get_ylim()
    assert 0.30 < lo < 0.3320 and 0.3340 < hi < 0.35, (lo, hi)
    assert (0.3340 - 0.3320) / (hi - lo) > 0.3  # apart by a third of the panel
    assert "damped persistence: 0.3340" in _legend(rmse) and "persistence: 0.6336 (off the axis)" in _legend(rmse)
    fig.canvas.draw()
    for ax in _panels(fig)[:2]:
        legend_box = ax.get_legend().get_window_extent()
        assert legend_box.x0 >= ax.get_window_extent().x1  # beside the plot, never over its lines
    plt.close(fig)


@pytest.mark.parametrize("n_val", [1, 60])
def test_reid_curves_show_the_selection_metric_and_both_directions(n_val: int) -> None:
    import matplotlib.pyplot as plt

    train, val = reid_rows(n_val)
    fig = curves_figure(train, val, "r (reid)", selection="rgb2ir_mAP", task="reid")
    axes = _panels(fig)
    assert [a.get_title() for a in axes] == ["loss", "validation mAP", "validation rank-1", "learning rate"]
    m_ap, rank1 = axes[1], axes[2]
    assert _legend(m_ap)[0].startswith("RGB→IR (selects best.pt): ") and _legend(m_ap)[1].startswith("IR→RGB: ")
    assert [t.split(":")[0] for t in _legend(rank1)] == ["RGB→IR", "IR→RGB"]  # rank-5/10 stay in summary.json
    for line in m_ap.get_lines():  # every validation point has a marker: one point is a visible dot
        assert line.get_marker() == "o" and len(line.get_xdata()) == n_val
    assert m_ap.get_lines()[0].get_linewidth() > m_ap.get_lines()[1].get_linewidth()
    w, h = fig.get_size_inches() * 110
    assert w < 1800 and h > 600  # a 2 x 2 grid (legends beside the panels), not one 2860-px row
    plt.close(fig)


def test_map_figure_shows_anomalies_month_and_rmse() -> None:
    import matplotlib.pyplot as plt

    d = month_arrays(np.random.default_rng(1))
    fig = map_figure(d, "run (era5)")
    titles = [a.get_title() for a in _panels(fig)]
    assert titles[:3] == ["truth", "prediction", "climatology of this calendar month (training years)"]
    assert titles[3:5] == [
        "truth anomaly (truth − climatology)",
        "predicted anomaly (prediction − climatology)",
    ]
    lats = np.sort(d["lats"])
    order = np.argsort(d["lats"])
    valid = d["mask"][order] & np.isfinite(d["truth_c"][order])
    rmse = weighted_rmse(d["pred_c"][order], d["truth_c"][order], lats, valid)
    assert titles[5] == f"error (prediction − truth)\nlat-weighted RMSE {rmse:.4f} °C"
    sup = fig._suptitle.get_text()
    assert "test month June 2019" in sup and f"model RMSE {rmse:.4f} °C" in sup and "persistence RMSE" in sup
    # anomalies and error share one symmetric colour scale, so the error reads against the signal
    lims = {a.collections[0].get_clim() for a in _panels(fig)[3:]}
    assert len(lims) == 1 and next(iter(lims))[0] == -next(iter(lims))[1]
    plt.close(fig)


def test_map_figure_across_the_dateline_is_drawn_where_the_area_is() -> None:
    """Niño 3.4 at 1° has lons 170.5 .. 179.5, -179.5 .. -120.5: the map must span those 70°, not the globe."""
    import warnings

    import matplotlib.pyplot as plt

    rng = np.random.default_rng(3)
    lats, lons = np.arange(-4.5, 5), np.r_[np.arange(170.5, 180), np.arange(-179.5, -120)]
    truth = 27 + rng.standard_normal((lats.size, lons.size))
    d = {"truth_c": truth, "pred_c": truth + 0.1, "lats": lats, "lons": lons, "clim_c": truth - 0.5}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pcolormesh warned of non-monotonic coordinates and smeared the field
        fig = map_figure(d)
    fig.canvas.draw()
    ax = _panels(fig)[0]
    lo, hi = ax.get_xlim()
    assert 169 <= lo < 171 and 239 < hi <= 241, (lo, hi)  # 70° wide, continuing eastward past 180
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels and all(-180 <= float(t.replace("−", "-")) <= 180 for t in labels), labels
    assert any(float(t.replace("−", "-")) < 0 for t in labels)  # west longitudes east of the dateline
    plt.close(fig)


def test_map_figure_without_climatology_and_bad_arrays() -> None:
    import matplotlib.pyplot as plt

    d = month_arrays(np.random.default_rng(2), clim=False)
    del d["year"], d["month"]
    fig = map_figure(d)
    assert [a.get_title().split("\n")[0] for a in _panels(fig)] == [
        "truth",
        "prediction",
        "error (prediction − truth)",
    ]
    sup = fig._suptitle.get_text()
    assert "test sample 18 (target month 6)" in sup and "no clim_c" in sup
    plt.close(fig)
    with pytest.raises(ValueError, match="month=13"):
        map_figure({**month_arrays(np.random.default_rng(3)), "month": np.int64(13)})
    with pytest.raises(ValueError, match="clim_c has shape"):
        map_figure({**month_arrays(np.random.default_rng(3)), "clim_c": np.zeros((3, 3))})
    with pytest.raises(ValueError, match="missing arrays"):
        map_figure({"truth_c": np.zeros((2, 2))})


def test_sysu_trial_spread_is_a_band_not_panels_of_its_own() -> None:
    """SYSU-MM01 logs mean and std over gallery trials (val_allsearch_mAP, ..._mAP_std, ..._trials): the std and
    the trial count used to get three extra panels (val_allsearch_mAP_std, ..._rank1_std, ..._rank10_std)."""
    import matplotlib.pyplot as plt

    train, _ = reid_rows(1)
    val = []
    for i in range(3):
        m: dict = {}
        for proto in ("allsearch", "indoor"):
            for k in ("mAP", "rank1", "rank10", "rank20"):
                m[f"val_{proto}_{k}"] = 0.2 + 0.1 * i
                m[f"val_{proto}_{k}_std"] = 0.02
            m[f"val_{proto}_trials"] = 10
        val.append({"kind": "val", "step": 640 * (i + 1), "epoch": 20 * (i + 1), **m})
    fig = curves_figure(train, val, "s (reid)", selection="val_allsearch_mAP", task="reid")
    axes = _panels(fig)
    assert [a.get_title() for a in axes] == ["loss", "validation mAP", "validation rank-1", "learning rate"]
    assert [t.split(":")[0] for t in _legend(axes[1])] == ["allsearch (selects best.pt)", "indoor"]
    assert len(axes[1].collections) == 2  # one ± std band per protocol
    plt.close(fig)


def _user_run(run: Path, summary: dict | None) -> Path:
    """A user's task (metrics={"acc": accuracy}, monitor_metric="val_acc", monitor_mode="max") as the engine writes
    it: its val_acc is a classification accuracy, not the SST task's anomaly correlation."""
    run.mkdir(parents=True)
    rows = [{"kind": "train", "step": s, "epoch": s // 4 + 1, "loss": 1.0 / s, "lr": 1e-3} for s in range(1, 13)]
    rows += [{"kind": "val", "step": s, "epoch": s // 4, "val_loss": 1.0 / s, "val_acc": 0.5 + s / 40, "val_f1": 0.4}
             for s in (4, 8, 12)]  # fmt: skip
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    return run


@pytest.mark.parametrize(
    ("summary", "acc_label"),
    [
        ({"task": "mine", "best": {"val_acc": 0.8}}, "val_acc, higher is better"),  # the monitor mode, read back
        ({"task": "mine", "best": {"val_loss": 1 / 12}}, "val_acc"),  # direction unknown: the name alone
        (None, "val_acc"),
    ],
)
def test_another_tasks_metrics_are_labelled_with_their_own_names(tmp_path: Path, summary, acc_label) -> None:
    """A run with metrics={"acc": accuracy} used to get the SST task's "anomaly correlation, higher is better"."""
    import matplotlib.pyplot as plt

    from utils.plot import _run_info, monitor_directions

    run = _user_run(tmp_path / "run", summary)
    assert "curves.png" in [p.name for p in plot_run(run)]
    train, val = read_metrics(run / "metrics.jsonl")
    title, task, best = _run_info(run)
    fig = curves_figure(train, val, title, next(iter(best), None), task, monitor_directions(val, best))
    axes = _panels(fig)
    assert [a.get_title() for a in axes] == ["loss", "val_acc", "val_f1", "learning rate"]
    assert axes[1].get_ylabel() == acc_label and axes[2].get_ylabel() == "val_f1"
    assert _legend(axes[1])[0].startswith("val_acc")  # not the SST task's "model"
    text = " ".join(a.get_ylabel() + " ".join(_legend(a)) for a in axes)
    assert "anomaly correlation" not in text and "°C" not in text
    plt.close(fig)


def test_directions_given_by_the_caller_win_and_the_sst_task_keeps_its_meaning() -> None:
    import matplotlib.pyplot as plt

    train = [{"kind": "train", "step": s, "epoch": s, "loss": 0.5} for s in range(1, 4)]
    val = [{"kind": "val", "step": s, "epoch": s, "val_acc": 0.7, "val_err": 0.2} for s in range(1, 4)]
    fig = curves_figure(train, val, "t", directions={"val_err": "min"})
    assert [a.get_ylabel() for a in _panels(fig)[1:]] == ["val_acc", "val_err, lower is better"]
    plt.close(fig)
    fig = curves_figure(train, val, "t", task="era5")
    assert _panels(fig)[1].get_ylabel() == "anomaly correlation, higher is better"
    plt.close(fig)
