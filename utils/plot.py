"""Plots of a run directory: learning curves with units and baselines, throughput and data wait, SST test-month maps.

    python -m utils.plot RUN_DIR        # writes RUN_DIR/plots/*.png

Reads RUN_DIR/metrics.jsonl (rows {"kind": "train", "step", "epoch", "loss", "lr", "samples_per_s",
"data_wait_frac", "time", ...} and {"kind": "val", "step", "epoch", "val_loss", <metrics>...}),
RUN_DIR/summary.json (optional: the task, the title, and which metric selects best.pt) and RUN_DIR/test_month.npz
(optional; see `map_figure` for its keys). matplotlib is a dependency (requirements.txt); without it this module
exits with status 2 and says how to install it.

- `curves.png`: loss (train and validation), then one panel per kind of validation metric, the learning rate last.
  The built-in tasks' metrics get their meaning: the SST task (era5) RMSE in °C and ACC, each with the statistical
  baselines as dashed lines (keys `val_<baseline>_rmse_c`; the axis spans the model and the best baseline, not 0,
  so close scores stay apart), re-ID (reid) mAP and rank-1 in both directions. Any other task's metric is labelled
  with its own name, and "higher/lower is better" only when its direction is known (the task's monitor mode, read
  from summary.json's best value). The metric that selects best.pt is drawn bold; legends sit beside the panels;
  validation points carry markers, so one validation is as readable as many.
- `throughput.png`: samples/s and the share of step time spent waiting for data.
- `test_month_maps.png`: truth, prediction and climatology in °C, and under them the anomalies (truth −
  climatology, prediction − climatology) beside the error, all three on one colour scale so the error reads
  against the signal the model had to forecast.
"""

from __future__ import annotations

import calendar
import json
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_run", "read_metrics", "map_figure", "curves_figure", "monitor_directions", "main"]


def _mpl() -> Any:
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("utils.plot needs matplotlib (in requirements.txt): pip install matplotlib") from e
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
                raise ValueError(f"{path}:{i}: not valid JSON ({e.msg}); each line must be one JSON object") from e
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{i}: expected a JSON object, got {type(row).__name__}")
            kind = row.get("kind")
            if kind == "train":
                train.append(row)
            elif kind == "val":
                val.append(row)
    return train, val


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _series(rows: list[dict], key: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    pts = [(r[x], r[key]) for r in rows if _num(r.get(key)) and _num(r.get(x))]
    if not pts:
        return np.array([]), np.array([])
    a = np.asarray(pts, dtype=float)
    return a[:, 0], a[:, 1]


# --------------------------------------------------------------------------- which metric goes where
_NOT_METRICS = {"kind", "step", "epoch", "time", "val_loss", "lr"}
# the statistical forecasts a model is scored beside (fitted on training months; flat lines over training)
_BASELINES = {
    "persistence": "persistence",
    "climatology": "climatology (calendar month)",
    "anomaly_persistence": "anomaly persistence",
    "damped_persistence": "damped persistence",
    "lim": "LIM",
    "hybrid": "hybrid (LIM + damped persistence)",
    "prior": "prior (the forecast the model corrects)",
}
_BASELINE_COLORS = {"persistence": "dimgray", "climatology (calendar month)": "tab:olive",
                    "anomaly persistence": "tab:cyan", "damped persistence": "tab:pink", "LIM": "tab:brown",
                    "hybrid (LIM + damped persistence)": "tab:purple",
                    "prior (the forecast the model corrects)": "black"}  # fmt: skip
_DIRECTIONS = {"rgb2ir": "RGB→IR", "ir2rgb": "IR→RGB"}
# a built-in task's panels: (pattern on the key, panel title, y label); the first match wins. Only that task's
# metrics get its meaning (a user's `acc` is not an anomaly correlation); other keys get their own panel.
_PANELS: dict[str, tuple[tuple[re.Pattern[str], str, str], ...]] = {
    "era5": (
        (re.compile(r"rmse_c$"), "validation RMSE", "RMSE (°C), lower is better"),
        (re.compile(r"(^|_)acc$"), "validation ACC", "anomaly correlation, higher is better"),
    ),
    "reid": (
        (re.compile(r"(^|_)mAP$"), "validation mAP", "mAP, higher is better"),
        (re.compile(r"(^|_)rank1$"), "validation rank-1", "rank-1 accuracy, higher is better"),
    ),
}
_BETTER = {"max": "higher is better", "min": "lower is better"}
# rank-k beyond 1 and the spread / count of SYSU-MM01's gallery trials: in summary.json, not panels of their own
# (a metric's `_std` is drawn as a band around it)
_HIDDEN = re.compile(r"(^|_)rank(5|10|20)$|_std$|(^|_)trials$")


def _series_label(key: str) -> tuple[str, bool]:
    """(legend label, is a baseline) for a validation key like val_persistence_rmse_c or ir2rgb_rank1."""
    core = re.sub(r"^(val|test)_", "", key)
    for unit in ("_rmse_c", "rmse_c", "_acc", "acc"):
        if core.endswith(unit):
            name = core[: -len(unit)].rstrip("_")
            if name in _BASELINES:
                return _BASELINES[name], True
            return ("model" if not name else name.replace("_", " ")), False
    direction = core.split("_", 1)[0] if "_" in core else ""
    return (_DIRECTIONS.get(direction, direction or "query→gallery")), False


def _group_metrics(
    val: list[dict], task: str | None = None, directions: Mapping[str, str] | None = None
) -> list[tuple[str, str, list[str]]]:
    """(panel title, y label, keys) per panel; the task's own panels first, then up to 3 other metrics, each
    labelled with its name (and its direction, "min" or "max" in `directions`, when known)."""
    keys: list[str] = []
    for r in val:
        for k, v in r.items():
            if k not in _NOT_METRICS and k not in keys and _num(v) and not _HIDDEN.search(k):
                keys.append(k)
    panels: list[tuple[str, str, list[str]]] = []
    rest = list(keys)
    for pat, title, ylabel in _PANELS.get(task or "", ()):
        hit = [k for k in rest if pat.search(k)]
        if hit:
            panels.append((title, ylabel, hit))
            rest = [k for k in rest if k not in hit]
    for k in rest[:3]:  # other metrics: their own panel, the name as the label
        better = _BETTER.get((directions or {}).get(k, ""))
        panels.append((k, f"{k}, {better}" if better else k, [k]))
    return panels


def monitor_directions(val: list[dict], best: Mapping[str, Any]) -> dict[str, str]:
    """{metric: "min" or "max"} for the metric that selects best.pt (summary.json's {"best": {metric: value}}):
    its best value is the lowest or the highest it logged. Empty when that does not tell (one value, no rows)."""
    out: dict[str, str] = {}
    for key, value in best.items():
        _, ys = _series(val, key)
        if not _num(value) or ys.size < 2 or ys.min() == ys.max():
            continue
        if math.isclose(value, ys.min(), rel_tol=1e-9, abs_tol=1e-12):
            out[key] = "min"
        elif math.isclose(value, ys.max(), rel_tol=1e-9, abs_tol=1e-12):
            out[key] = "max"
    return out


# --------------------------------------------------------------------------- learning curves
def _epoch_axis(ax: Any, rows: list[dict]) -> None:
    """An epoch scale on top when step and epoch are proportional (epoch-based runs)."""
    pts = [(r["step"], r["epoch"]) for r in rows if _num(r.get("step")) and _num(r.get("epoch")) and r["epoch"] > 0]
    if not pts:
        return
    per = max(s for s, _ in pts) / max(e for _, e in pts)
    if per <= 0 or any(abs(s / per - e) > 1.0 for s, e in pts):
        return
    sec = ax.secondary_xaxis("top", functions=(lambda s: s / per, lambda e: e * per))
    sec.set_xlabel("epoch", fontsize=8)
    sec.tick_params(labelsize=8)


def _val_markers(n: int) -> dict[str, Any]:
    return {"marker": "o", "ms": 6 if n <= 30 else 3}


def _metric_ylim(model: list[float], baselines: list[float], higher_better: bool) -> tuple[float, float] | None:
    """The y range of a validation-metric panel: the model's values and the best baseline (the one it has to beat),
    padded. It starts at 0 only when the values come near 0: RMSEs of 0.336 and 0.337 on a 0..0.4 axis would read
    as one line. Baselines outside the range stay off the axis (the legend gives their values)."""
    if not model and not baselines:
        return None
    pts = list(model)
    if baselines:
        pts.append(max(baselines) if higher_better else min(baselines))
    # baselines inside the model's own range are shown too
    pts += [b for b in baselines if model and min(model) <= b <= max(model)]
    lo, hi = min(pts), max(pts)
    span = hi - lo
    pad = 0.12 * span if span > 0 else 0.05 * max(abs(hi), 1e-3)
    lo, hi = lo - pad, hi + pad
    if lo <= 0 or lo < 0.3 * hi:  # near 0 anyway: the natural axis from 0
        lo = 0.0 if min(pts) >= 0 else lo
    if min(pts) >= 0 and max(pts) <= 1.0 and hi > 1.0:  # scores that end at 1 (ACC, mAP, rank-1)
        hi = min(hi, 1.02)
    return lo, hi


def curves_figure(
    train: list[dict],
    val: list[dict],
    title: str = "",
    selection: str | None = None,
    task: str | None = None,
    directions: Mapping[str, str] | None = None,
) -> Any:
    """The learning-curve figure (a matplotlib Figure), or None when there is nothing to plot.

    `selection` is the validation key that chooses best.pt (drawn bold and named in the legend); `task` the task's
    name ("era5" and "reid" get their metrics' meaning and baselines); `directions` {metric: "min" or "max"}, e.g.
    {task.monitor_metric: task.monitor_mode}, adds "lower/higher is better" to another task's metric."""
    plt = _mpl()
    xs, ys = _series(train, "loss")
    xv, yv = _series(val, "val_loss")
    xl, yl = _series(train, "lr")
    groups = _group_metrics(val, task, directions)
    task_panels = _PANELS.get(task or "", ())
    own = {k for _, _, keys in groups for k in keys if any(pat.search(k) for pat, _, _ in task_panels)}
    if not (xs.size or xv.size or groups or xl.size):
        return None
    panels = [("loss", "loss")] + [(t, y) for t, y, _ in groups] + ([("learning rate", "lr")] if xl.size else [])
    n = len(panels)
    ncols = 1 if n == 1 else 2
    nrows = math.ceil(n / ncols)
    # 7.8 wide a panel: the plot, and its legend beside it
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.8 * ncols, 3.7 * nrows), squeeze=False)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    steps = [r["step"] for r in train + val if _num(r.get("step"))]
    x_hi = max(steps) if steps else 1.0
    pad = 0.03 * x_hi or 1.0

    ax = flat[0]
    if xs.size:
        ax.plot(
            xs,
            ys,
            lw=1.2,
            alpha=0.9,
            label="train",
            color="tab:blue",
            **({"marker": "."} if xs.size < 30 else {}),
        )
    if xv.size:
        ax.plot(xv, yv, lw=1.5, label="validation", color="tab:orange", **_val_markers(xv.size))
    all_y = np.concatenate([ys, yv])
    if all_y.size and all_y.min() > 0 and all_y.max() / all_y.min() > 30:  # spans decades: log reads better
        ax.set_yscale("log")
    ax.set_title("loss")
    ax.set_ylabel("loss (training objective)")
    if not all_y.size:
        ax.text(0.5, 0.5, "no loss logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    else:
        ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)

    for ax, (ptitle, ylabel, keys) in zip(flat[1:], groups):
        styles = iter(("tab:green", "tab:purple", "tab:red", "tab:brown"))
        seen: list[float] = []
        baselines: list[tuple[Any, str, float]] = []  # (line, label, final value)
        for key in keys:
            xm, ym = _series(val, key)
            if not xm.size:
                continue
            label, baseline = _series_label(key) if key in own else (key, False)
            if baseline:
                color = _BASELINE_COLORS.get(label, "gray")
                if np.ptp(ym) <= 1e-9 * max(1.0, abs(ym[-1])):  # a baseline does not change with training
                    line = ax.axhline(ym[-1], ls="--", lw=1.2, color=color)
                else:
                    (line,) = ax.plot(xm, ym, ls="--", lw=1.2, color=color)
                baselines.append((line, label, float(ym[-1])))
                continue
            seen += list(ym)
            chosen = key == selection
            line_color = next(styles, None)
            ax.plot(xm, ym, lw=2.4 if chosen else 1.4, color=line_color, **_val_markers(xm.size),
                    label=f"{label}{' (selects best.pt)' if chosen else ''}: {ym[-1]:.4f}")  # fmt: skip
            xsd, sd = _series(val, f"{key}_std")  # mean ± std over trials (SYSU-MM01's gallery draws)
            if xsd.size and xsd.size == xm.size and np.array_equal(xsd, xm):
                ax.fill_between(xm, ym - sd, ym + sd, color=line_color, alpha=0.15, lw=0)
                seen += list(ym - sd) + list(ym + sd)
        lim = _metric_ylim(seen, [b for _, _, b in baselines], ylabel.endswith("higher is better"))
        for line, label, final in baselines:
            off = lim is not None and not lim[0] <= final <= lim[1]
            line.set_label(f"{label}: {final:.4f}{' (off the axis)' if off else ''}")
        if lim is not None:
            ax.set_ylim(*lim)
        ax.set_title(ptitle)
        ax.set_ylabel(ylabel)
        # beside the panel, never over the lines it names
        ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)

    if xl.size:
        ax = flat[n - 1]
        ax.plot(xl, yl, lw=1.4, color="tab:gray", **({"marker": "."} if xl.size < 30 else {}))
        ax.set_title("learning rate")
        ax.set_ylabel("learning rate")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        ax.set_ylim(bottom=0)

    for i, ax in enumerate(flat[:n]):
        ax.set_xlim(-pad, x_hi + pad)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if i < ncols:
            _epoch_axis(ax, train + val)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def _speed_plot(plt: Any, train: list[dict], title: str, out: Path) -> Path | None:
    xs, sps = _series(train, "samples_per_s")
    xd, dw = _series(train, "data_wait_frac")
    if not xs.size and not xd.size:
        return None
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 5.2), sharex=True)
    if xs.size:
        a1.plot(xs, sps, lw=1.2, color="tab:blue", **({"marker": "o", "ms": 4} if xs.size < 30 else {}))
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
    else:
        a2.text(0.5, 0.5, "data wait not measured", ha="center", va="center", transform=a2.transAxes, color="gray")
    a2.set_ylim(0, 100)
    a2.set_ylabel("waiting for data (%)")
    a2.set_xlabel("optimizer step")
    a2.grid(alpha=0.3)
    return _finish(plt, fig, title, out)


def _finish(plt: Any, fig: Any, title: str, out: Path, tight: bool = True) -> Path:
    """Title, lay out, write and close a figure."""
    fig.suptitle(title, fontsize=11)
    if tight:
        fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# --------------------------------------------------------------------------- SST maps
def _month_title(d: Mapping[str, Any]) -> str:
    year = int(np.asarray(d["year"])) if "year" in d else None
    month = int(np.asarray(d["month"])) if "month" in d else None
    if month is not None and not 1 <= month <= 12:
        raise ValueError(f"test_month.npz: month={month} must be 1..12 (January = 1)")
    if month is not None:
        return f"{calendar.month_name[month]} {year}" if year is not None else calendar.month_name[month]
    return str(np.asarray(d["label"])) if "label" in d else ""


def map_figure(source: Path | Mapping[str, Any], title: str = "") -> Any:
    """The test-month figure (a matplotlib Figure) from test_month.npz or a dict of its arrays.

    Keys: truth_c, pred_c (H, W) °C; lats (H,), lons (W,); optional mask (H, W, True = scored ocean cell),
    year and month (integers, January = 1), label (text used when year/month are absent), clim_c (the
    training years' climatology of the target calendar month, (H, W) °C: needed for the anomaly row) and
    last_input_c (the last input month: its RMSE is quoted as persistence)."""
    from utils.metrics import acc, weighted_rmse

    plt = _mpl()
    name = str(source) if isinstance(source, (str, Path)) else "test_month arrays"
    d: Mapping[str, Any] = dict(np.load(source, allow_pickle=False)) if isinstance(source, (str, Path)) else source
    missing = {"truth_c", "pred_c", "lats", "lons"} - set(d)
    if missing:
        raise ValueError(
            f"{name}: missing arrays {sorted(missing)}; expected truth_c, pred_c, lats, lons "
            "(+ optional mask, year, month, label, clim_c, last_input_c)"
        )
    truth = np.asarray(d["truth_c"], dtype=float).squeeze()
    pred = np.asarray(d["pred_c"], dtype=float).squeeze()
    lats, lons = np.asarray(d["lats"], dtype=float), np.asarray(d["lons"], dtype=float)
    if truth.shape != pred.shape or truth.shape != (lats.size, lons.size):
        raise ValueError(
            f"{name}: truth_c {truth.shape} and pred_c {pred.shape} must both be (len(lats), len(lons)) = "
            f"({lats.size}, {lons.size})"
        )

    def optional(key: str) -> np.ndarray | None:
        if key not in d:
            return None
        a = np.asarray(d[key], dtype=float).squeeze()
        if a.shape != truth.shape:
            raise ValueError(f"{name}: {key} has shape {a.shape}, expected {truth.shape} like truth_c")
        return a

    clim, last = optional("clim_c"), optional("last_input_c")
    valid = np.isfinite(truth) & np.isfinite(pred)
    if "mask" in d:
        m = np.asarray(d["mask"]).astype(bool).squeeze()
        if m.shape == truth.shape:
            valid &= m  # mask: True = ocean cell that is scored
    if clim is not None:
        valid &= np.isfinite(clim)
    if not valid.any():
        raise ValueError(f"{name}: no cell where truth, prediction (and climatology) are all finite")
    order = np.argsort(lats)  # pcolormesh wants monotonic coordinates; ERA5 latitude runs 90 -> -90
    lats, valid = lats[order], valid[order]

    def field(a: np.ndarray) -> np.ndarray:
        return np.where(valid, a[order], np.nan)

    truth, pred = field(truth), field(pred)
    err = pred - truth
    rmse = weighted_rmse(pred, truth, lats, valid)
    head = [f"model RMSE {rmse:.4f} °C"]
    if clim is not None:
        clim = field(clim)
        head.append(f"ACC {acc(pred, truth, clim, lats, valid):.3f}")
    if last is not None:
        last = field(last)
        head.append(f"persistence RMSE {weighted_rmse(last, truth, lats, valid):.4f} °C")

    # an area across the dateline holds e.g. 170 .. 179, -180 .. -121: pcolormesh needs monotonic coordinates, so
    # the longitudes continue eastward past 180 (170 .. 239) and the axis labels wrap them back
    wrapped = bool(np.any(np.diff(lons) < -180))
    if wrapped:
        lons = lons + 360.0 * np.concatenate([[0], np.cumsum(np.diff(lons) < -180)])
    aspect = (lons.max() - lons.min()) / max(lats.max() - lats.min(), 1e-6)
    nrows = 2 if clim is not None else 1
    panel_h = 15 / 3 / aspect
    fig, axes = plt.subplots(
        nrows, 3, figsize=(15, nrows * max(2.4, panel_h + 0.4) + 0.7), squeeze=False, constrained_layout=True
    )
    absolute = [truth, pred] + ([clim] if clim is not None else [])
    vmin, vmax = np.nanpercentile(np.concatenate([a[valid] for a in absolute]), [1, 99])

    def draw(ax: Any, data: np.ndarray, name: str, cmap: str, lim: tuple[float, float]) -> Any:
        cmap_obj = plt.get_cmap(cmap).with_extremes(bad="#d9d9d9")  # land / missing in light grey
        im = ax.pcolormesh(
            lons, lats, np.ma.masked_invalid(data), cmap=cmap_obj, vmin=lim[0], vmax=lim[1], shading="auto"
        )
        ax.set_title(name, fontsize=10)
        ax.set_aspect("equal")
        ax.set_xlabel("longitude (°)", fontsize=8)
        if wrapped:
            ax.xaxis.set_major_formatter(lambda x, _pos: f"{180 - (180 - x) % 360:g}")  # (-180, 180]
        ax.set_ylabel("latitude (°)", fontsize=8)
        ax.tick_params(labelsize=8)
        return im

    err_title = f"error (prediction − truth)\nlat-weighted RMSE {rmse:.4f} °C"
    if clim is None:
        im = draw(axes[0, 0], truth, "truth", "RdYlBu_r", (vmin, vmax))
        draw(axes[0, 1], pred, "prediction", "RdYlBu_r", (vmin, vmax))
        fig.colorbar(im, ax=axes[0, :2], shrink=0.85, label="SST (°C)")
        emax = float(np.nanpercentile(np.abs(err), 99)) or 1.0
        im = draw(axes[0, 2], err, err_title, "RdBu_r", (-emax, emax))
        fig.colorbar(im, ax=axes[0, 2], shrink=0.85, label="°C")
        head.append("no anomaly maps: test_month.npz has no clim_c")
    else:
        im = draw(axes[0, 0], truth, "truth", "RdYlBu_r", (vmin, vmax))
        draw(axes[0, 1], pred, "prediction", "RdYlBu_r", (vmin, vmax))
        draw(axes[0, 2], clim, "climatology of this calendar month (training years)", "RdYlBu_r", (vmin, vmax))
        fig.colorbar(im, ax=axes[0, :], shrink=0.85, label="SST (°C)")
        a_t, a_p = truth - clim, pred - clim
        amax = float(np.nanpercentile(np.abs(np.concatenate([a_t[valid], a_p[valid]])), 99.9)) or 1.0
        im = draw(axes[1, 0], a_t, "truth anomaly (truth − climatology)", "RdBu_r", (-amax, amax))
        draw(axes[1, 1], a_p, "predicted anomaly (prediction − climatology)", "RdBu_r", (-amax, amax))
        draw(axes[1, 2], err, err_title, "RdBu_r", (-amax, amax))
        fig.colorbar(im, ax=axes[1, :], shrink=0.85, label="anomaly / error (°C), one scale")
    when = _month_title(d)
    fig.suptitle(
        f"{title}  —  test month {when}".strip(" —") + "\n" + ", ".join(head), fontsize=11
    )  # fmt: skip
    return fig


# --------------------------------------------------------------------------- the run directory
def _run_info(run_dir: Path) -> tuple[str, str | None, dict[str, Any]]:
    """(title, task name, {the validation key that selects best.pt: its best value}) from summary.json, when it is
    there."""
    title, task, best = run_dir.name, None, {}
    summ = run_dir / "summary.json"
    if summ.exists():
        try:
            s = json.loads(summ.read_text(encoding="utf-8"))
            name = s.get("task") or (s.get("config") or {}).get("task")
            task = name if isinstance(name, str) else None
            title = f"{run_dir.name}" + (f" ({task})" if task else "")
            if isinstance(s.get("best"), dict) and len(s["best"]) == 1:
                best = dict(s["best"])
        except (json.JSONDecodeError, AttributeError):
            pass
    return title, task, best


def plot_run(run_dir: Path, directions: Mapping[str, str] | None = None) -> list[Path]:
    """Write RUN_DIR/plots/{curves,throughput,test_month_maps}.png (those with data); return their paths.

    `directions` ({metric: "min" or "max"}) labels metrics "lower/higher is better"; without it the direction of
    the metric that selects best.pt is read from summary.json's best value."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "is a file, not a run directory" if run_dir.exists() else "does not exist"
        raise FileNotFoundError(f"plot_run: {run_dir} {what}; give a run directory (runs/NAME)")
    metrics = run_dir / "metrics.jsonl"
    npz = run_dir / "test_month.npz"
    if not metrics.exists() and not npz.exists():
        raise FileNotFoundError(
            f"plot_run: {run_dir} has neither metrics.jsonl nor test_month.npz; is it a run directory?"
        )
    plt = _mpl()
    title, task, best = _run_info(run_dir)
    selection = next(iter(best), None)
    out_dir = run_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    written: list[Path] = []
    if metrics.exists():
        train, val = read_metrics(metrics)
        known = monitor_directions(val, best) if directions is None else directions
        fig = curves_figure(train, val, title, selection, task, known)
        if fig is not None:
            fig.savefig(out_dir / "curves.png", dpi=110)
            plt.close(fig)
            written.append(out_dir / "curves.png")
        p = _speed_plot(plt, train, title, out_dir / "throughput.png")
        if p is not None:
            written.append(p)
    if npz.exists():
        fig = map_figure(npz, title)
        fig.savefig(out_dir / "test_month_maps.png", dpi=110)
        plt.close(fig)
        written.append(out_dir / "test_month_maps.png")
    return written


def main(argv: list[str] | None = None, prog: str = "python -m utils.plot") -> int:
    """`prog RUN_DIR`: exit 0 drawn (or nothing to draw), 2 a bad argument or no matplotlib (the CLI's codes)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(f"usage: {prog} RUN_DIR   (writes RUN_DIR/plots/*.png)", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        paths = plot_run(Path(argv[0]))
    except (ImportError, FileNotFoundError, ValueError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    if not paths:
        print(f"nothing to plot in {argv[0]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
