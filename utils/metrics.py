"""Forecast scores for gridded fields: latitude-weighted RMSE (°C) and anomaly correlation (ACC) over ocean
cells, and the baselines every score is printed beside (persistence, climatology, anomaly persistence, and any
fitted ones passed in, e.g. damped persistence and LIM from `utils.baselines`).

numpy only (torch tensors are accepted and moved to the host). Arrays are (N, H, W) in °C; `lats` are the H
cell-centre latitudes; `mask` is an (H, W) bool, True on ocean. NaN outside the mask is ignored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from utils.baselines import unfitted_forecasts


def _np(a: Any) -> np.ndarray:
    if hasattr(a, "detach"):  # torch tensor: one deliberate host copy, at scoring time only
        a = a.detach().float().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def lat_weights(lats: np.ndarray) -> np.ndarray:
    """Area weights ∝ cos φ of each row, normalised to mean 1 over the given rows."""
    w = np.cos(np.deg2rad(np.asarray(lats, dtype=np.float64)))
    w = np.clip(w, 0.0, None)
    if w.sum() <= 0:
        raise ValueError(f"lat_weights: latitudes {np.asarray(lats)} have no positive cos-latitude weight")
    return w / w.mean()


def _prepare(pred_c: Any, truth_c: Any, lats: np.ndarray, mask: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p, t = _np(pred_c), _np(truth_c)
    m = _np(mask).astype(bool)
    if p.shape != t.shape:
        raise ValueError(f"prediction shape {p.shape} != truth shape {t.shape}")
    if p.ndim == 2:
        p, t = p[None], t[None]
    if m.shape != p.shape[-2:] or len(lats) != p.shape[-2]:
        raise ValueError(f"mask {m.shape} / lats ({len(lats)},) do not match fields {p.shape}")
    if not m.any():
        raise ValueError("mask has no ocean cell to score")
    w = np.broadcast_to(lat_weights(lats)[:, None], m.shape)[m]  # (cells,)
    return p[:, m], t[:, m], w


def weighted_rmse(pred_c: Any, truth_c: Any, lats: np.ndarray, mask: Any) -> float:
    """sqrt of the cos-latitude weighted mean squared error over ocean cells and all N fields."""
    p, t, w = _prepare(pred_c, truth_c, lats, mask)
    se = (p - t) ** 2
    return float(np.sqrt(np.sum(se * w) / (w.sum() * se.shape[0])))


def acc(pred_c: Any, truth_c: Any, clim_c: Any, lats: np.ndarray, mask: Any) -> float:
    """Anomaly correlation: per field, Σw·a_p·a_t / sqrt(Σw·a_p² · Σw·a_t²) with anomalies from `clim_c`
    ((N, H, W), the climatology of each target), then the mean over fields. A field whose predicted anomaly
    is zero everywhere (the climatology forecast) scores 0."""
    p, t, w = _prepare(pred_c, truth_c, lats, mask)
    c = _np(clim_c)
    if c.ndim == 2:
        c = c[None]
    c = np.broadcast_to(c, _np(truth_c).reshape((-1,) + c.shape[-2:]).shape)[:, _np(mask).astype(bool)]
    ap, at = p - c, t - c
    num = np.sum(w * ap * at, axis=1)
    den = np.sqrt(np.sum(w * ap**2, axis=1) * np.sum(w * at**2, axis=1))
    per = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
    return float(per.mean())


def score_forecasts(
    pred_c: Any,
    truth_c: Any,
    last_input_c: Any,
    clim_target_c: Any,
    clim_input_c: Any,
    lats: np.ndarray,
    mask: Any,
    extra: dict[str, Any] | None = None,
    baselines: dict[str, dict[str, float]] | None = None,
) -> dict[str, dict[str, float]]:
    """RMSE and ACC of the model and of three baselines, all against the same truth and climatology:
    persistence (last input month), climatology (calendar-month mean of the target) and anomaly persistence
    (target climatology + the last input month's anomaly); then every °C forecast in `extra` by its name.

    `baselines`: what an earlier call on the same split returned without "model" (the baselines do not change
    between validations): reused as they are, so only the model is scored."""

    def score(f: Any, ct: Any) -> dict[str, float]:
        return {"rmse": weighted_rmse(f, truth_c, lats, mask), "acc": acc(f, truth_c, ct, lats, mask)}

    if baselines is not None:
        return {"model": score(pred_c, _np(clim_target_c)), **baselines}
    forecasts = {"model": _np(pred_c), **unfitted_forecasts(_np(last_input_c), _np(clim_target_c), _np(clim_input_c))}
    ct = forecasts["climatology"]
    for name, f in (extra or {}).items():
        if name in forecasts:
            raise ValueError(f"score_forecasts: extra forecast {name!r} clashes with a built-in one")
        forecasts[name] = _np(f)
    return {name: score(f, ct) for name, f in forecasts.items()}


def format_scores(scores: dict[str, dict[str, float]]) -> str:
    """A small Markdown table: one row per forecast, RMSE (°C, lower is better) and ACC (higher is better)."""
    lines = ["| forecast | RMSE (°C) | ACC |", "|---|---:|---:|"]
    for name, s in scores.items():
        lines.append(f"| {name} | {s['rmse']:.4f} | {s['acc']:.4f} |")
    return "\n".join(lines)
