"""Plots of a run directory: loss/metric curves, throughput and data wait over time, SST test-month maps.

    python -m utils.plot RUN_DIR        # writes RUN_DIR/plots/*.png

Reads RUN_DIR/metrics.jsonl (rows {"kind": "train", "step", "epoch", "loss", "lr", "samples_per_s",
"data_wait_frac", "time", ...} and {"kind": "val", "step", "epoch", "val_loss", <metrics>...}),
RUN_DIR/summary.json (optional, for the title) and RUN_DIR/test_month.npz (optional; keys truth_c,
pred_c, lats, lons, mask, label: maps of truth, prediction and error). matplotlib is an optional
dependency (`pip install matplotlib`); without it this module exits with status 2 and says so.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_run", "read_metrics", "main"]


def _mpl() -> Any:
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(
            "utils.plot needs matplotlib, an optional dependency: pip install matplotlib "
            "(or pip install -e '.[plots]')"
        ) from e
    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def read_metrics(path: Path) -> tuple[list[dict], list[dict]]:
    """(train rows, val rows) from a metrics.jsonl; a bad line raises ValueError naming file and line."""
    train, val = [], []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{i}: not valid JSON ({e.msg}); each line must be one JSON object"
                ) from e
            kind = row.get("kind")
            if kind == "train":
                train.append(row)
            elif kind == "val":
                val.append(row)
    return train, val


def _series(rows: list[dict], key: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    pts = [(r[x], r[key]) for r in rows if r.get(key) is not None and r.get(x) is not None]
    pts = [(a, b) for a, b in pts if isinstance(b, (int, float)) and math.isfinite(b)]
    if not pts:
        return np.array([]), np.array([])
    a = np.asarray(pts, dtype=float)
    return a[:, 0], a[:, 1]


_NOT_METRICS = {"kind", "step", "epoch", "time", "val_loss", "lr"}


def _loss_plot(plt: Any, train: list[dict], val: list[dict], title: str, out: Path) -> Path | None:
    metric_keys = sorted(
        {k for r in val for k, v in r.items() if k not in _NOT_METRICS and isinstance(v, (int, float))}
    )
    n_panels = 1 + len(metric_keys[:4])
    fig, axes = plt.subplots(1, n_panels, figsize=(5.2 * n_panels, 3.8), squeeze=False)
    ax = axes[0, 0]
    xs, ys = _series(train, "loss")
    if xs.size:
        ax.plot(xs, ys, lw=1.0, alpha=0.85, label="train loss", color="tab:blue")
    xv, yv = _series(val, "val_loss")
    if xv.size:
        ax.plot(xv, yv, "o-", lw=1.5, ms=4, label="val loss", color="tab:orange")
    if not xs.size and not xv.size:
        plt.close(fig)
        return None
    all_y = np.concatenate([ys, yv])
    if all_y.size and all_y.min() > 0 and all_y.max() / all_y.min() > 30:  # spans decades: log reads better
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("loss")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    for ax, key in zip(axes[0, 1:], metric_keys[:4]):
        xm, ym = _series(val, key)
        ax.plot(xm, ym, "o-", ms=4, color="tab:green")
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    return _finish(plt, fig, title, out)


def _finish(plt: Any, fig: Any, title: str, out: Path, tight: bool = True) -> Path:
    """Title, lay out, write and close a figure."""
    fig.suptitle(title, fontsize=11)
    if tight:
        fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _speed_plot(plt: Any, train: list[dict], title: str, out: Path) -> Path | None:
    xs, sps = _series(train, "samples_per_s")
    xd, dw = _series(train, "data_wait_frac")
    if not xs.size and not xd.size:
        return None
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 5.2), sharex=True)
    if xs.size:
        a1.plot(xs, sps, lw=1.2, color="tab:blue")
        med = float(np.median(sps))
        a1.axhline(med, color="gray", ls="--", lw=0.8)
        a1.text(xs[0], med, f" median {med:.1f}", va="bottom", fontsize=8, color="gray")
        a1.set_ylim(bottom=0)
    a1.set_ylabel("samples / s")
    a1.set_title("throughput")
    a1.grid(alpha=0.3)
    if xd.size:
        a2.fill_between(xd, 100 * dw, step="mid", alpha=0.35, color="tab:red")
        a2.plot(xd, 100 * dw, lw=1.0, color="tab:red", drawstyle="steps-mid")
    a2.set_ylim(0, 100)
    a2.set_ylabel("waiting for data (%)")
    a2.set_xlabel("step")
    a2.grid(alpha=0.3)
    return _finish(plt, fig, title, out)


def _map_plot(plt: Any, npz_path: Path, title: str, out: Path) -> Path:
    d = np.load(npz_path, allow_pickle=False)
    need = {"truth_c", "pred_c", "lats", "lons"}
    missing = need - set(d.files)
    if missing:
        raise ValueError(
            f"{npz_path}: missing arrays {sorted(missing)}; expected truth_c, pred_c, lats, lons, mask, label"
        )
    truth = np.asarray(d["truth_c"], dtype=float).squeeze()
    pred = np.asarray(d["pred_c"], dtype=float).squeeze()
    lats, lons = np.asarray(d["lats"], dtype=float), np.asarray(d["lons"], dtype=float)
    if truth.shape != pred.shape or truth.shape != (lats.size, lons.size):
        raise ValueError(
            f"{npz_path}: truth_c {truth.shape} and pred_c {pred.shape} must both be (len(lats), len(lons)) = "
            f"({lats.size}, {lons.size})"
        )
    valid = np.isfinite(truth) & np.isfinite(pred)
    if "mask" in d.files:
        m = np.asarray(d["mask"]).astype(bool).squeeze()
        if m.shape == truth.shape:
            valid &= m  # mask: True = ocean cell that is scored
    label = str(d["label"]) if "label" in d.files else ""
    truth = np.where(valid, truth, np.nan)
    pred = np.where(valid, pred, np.nan)
    err = pred - truth
    order = np.argsort(lats)  # pcolormesh wants monotonic coordinates; ERA5 latitude runs 90 -> -90
    lats, truth, pred, err = lats[order], truth[order], pred[order], err[order]
    vmin, vmax = np.nanpercentile(np.concatenate([truth[valid[order]], pred[valid[order]]]), [1, 99])
    emax = float(np.nanpercentile(np.abs(err), 99)) or 1.0
    w = np.cos(np.deg2rad(lats))[:, None] * np.ones_like(err)
    ok = np.isfinite(err)
    rmse = float(np.sqrt(np.sum(w[ok] * err[ok] ** 2) / np.sum(w[ok]))) if ok.any() else float("nan")
    aspect = (lons.max() - lons.min()) / max(lats.max() - lats.min(), 1e-6)
    fig, axes = plt.subplots(1, 3, figsize=(15, max(3.2, 15 / 3 / aspect + 1.1)), constrained_layout=True)
    for ax, data, name, cmap, lim in (
        (axes[0], truth, "truth", "RdYlBu_r", (vmin, vmax)),
        (axes[1], pred, "prediction", "RdYlBu_r", (vmin, vmax)),
        (axes[2], err, f"error (pred − truth), lat-weighted RMSE {rmse:.2f} °C", "RdBu_r", (-emax, emax)),
    ):
        cmap_obj = plt.get_cmap(cmap).with_extremes(bad="#d9d9d9")  # land / missing in light grey
        im = ax.pcolormesh(
            lons, lats, np.ma.masked_invalid(data), cmap=cmap_obj, vmin=lim[0], vmax=lim[1], shading="auto"
        )
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("longitude (°)")
        ax.set_aspect("equal")
        fig.colorbar(im, ax=ax, shrink=0.8, label="°C")
    axes[0].set_ylabel("latitude (°)")
    return _finish(plt, fig, f"{title}  —  test month {label}".strip(" —"), out, tight=False)


def plot_run(run_dir: Path) -> list[Path]:
    """Write RUN_DIR/plots/{curves,throughput,test_month_maps}.png (those with data); return their paths."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"plot_run: run directory {run_dir} does not exist")
    metrics = run_dir / "metrics.jsonl"
    npz = run_dir / "test_month.npz"
    if not metrics.exists() and not npz.exists():
        raise FileNotFoundError(
            f"plot_run: {run_dir} has neither metrics.jsonl nor test_month.npz; is it a run directory?"
        )
    plt = _mpl()
    title = run_dir.name
    summ = run_dir / "summary.json"
    if summ.exists():
        try:
            s = json.loads(summ.read_text(encoding="utf-8"))
            task = s.get("task") or (s.get("config") or {}).get("task")
            title = f"{run_dir.name}" + (f" ({task})" if task else "")
        except (json.JSONDecodeError, AttributeError):
            pass
    out_dir = run_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    written: list[Path] = []
    if metrics.exists():
        train, val = read_metrics(metrics)
        for p in (
            _loss_plot(plt, train, val, title, out_dir / "curves.png"),
            _speed_plot(plt, train, title, out_dir / "throughput.png"),
        ):
            if p is not None:
                written.append(p)
    if npz.exists():
        written.append(_map_plot(plt, npz, title, out_dir / "test_month_maps.png"))
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m utils.plot RUN_DIR   (writes RUN_DIR/plots/*.png)", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        paths = plot_run(Path(argv[0]))
    except ImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    if not paths:
        print(f"nothing to plot in {argv[0]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
