"""Rolling-origin hindcast of the statistical SST forecasts, and how its scores pool (numpy only).

The protocol: for each test year Y every statistical forecast is refitted on the months before January Y
(climatology, EOFs, LIM, damping, ridge); its settings (the base: the hybrid, the wide-region hybrid or their blend;
ridge corrections on area and wide-region PCs) are chosen on the VAL_MONTHS months before Y, fitted on the months
before those; then it forecasts the targets of year Y. No test month is fitted on or chooses anything. RMSEs pool
the squared errors of all years (`pooled_rmse`); every ratio gets a 90 % interval from resampling whole years, a
block bootstrap with one-year blocks (`bootstrap_ratio`).

    r = rolling_statistical(data, months, lats, mask, lead=1, wide=wide)   # per-year squared errors, choices
    pooled_rmse(r["per_year"], "corrected"), bootstrap_ratio(r["per_year"], "corrected", "lim")

`python -m benchmarks.skill --rolling` runs it on HadISST, beside the network trained before each year.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np

from utils.baselines import (
    PRIOR_BASES,
    HybridLIM,
    LinearInverseModel,
    RidgeCorrection,
    WideRegion,
    blend,
    choice_reason,
    choose_on_validation,
    clear_gain,
    fit_baselines,
    per_month_sq_error,
)
from utils.metrics import lat_weights

ROLLING_YEARS, VAL_MONTHS = tuple(range(2006, 2022)), 36
RIDGE_MODES, RIDGE_MONTHS, RIDGE_ALPHAS = (5, 10, 20), (1, 2), (0.01, 0.1, 1.0, 10.0)
WIDE_MODES = (0, 5, 10)  # leading PCs of the wide region beside the area's own (0 = the area's only)
BASES = PRIOR_BASES  # forecasts validation may correct; the first one it has is the default (as the task's prior)


@dataclasses.dataclass
class _Stage:
    anom: np.ndarray  # (T, H, W) anomalies of every month against the stage's climatology
    fitted: dict[str, Any]  # the baselines
    basis: Any  # LinearInverseModel: EOFs of the area's ridge predictors
    wide: WideRegion | None = None
    wide_anom: Any = None  # (T, H, W) the same for the wide region
    wide_basis: Any = None
    wide_hybrid: Any = None  # HybridLIM fitted on the wide region (its defaults), read on the area
    errors: dict[tuple[str, int], np.ndarray] = dataclasses.field(default_factory=dict)  # (base, stop) -> misses


def _fit_stage(data: np.ndarray, cal: np.ndarray, lats: np.ndarray, mask: np.ndarray, stop: int, lead: int,
               wide: WideRegion | None = None) -> _Stage:  # fmt: skip
    """Everything fitted on months [0, stop): climatology, anomalies of every month, the baselines and the EOF bases
    of the ridge predictors (the area's and, with `wide`, the wide region's, plus its hybrid)."""

    def anomalies(d: np.ndarray) -> np.ndarray:
        return d - np.stack([d[:stop][cal[:stop] == m].mean(axis=0) for m in range(12)])[cal]

    anom = anomalies(data)
    basis = LinearInverseModel.fit(anom[:stop], lats, mask, variance=0.999, max_modes=max(RIDGE_MODES))
    st = _Stage(anom, fit_baselines(anom[:stop], lats, mask, lead), basis, wide)
    if wide is not None:
        wa = st.wide_anom = anomalies(wide.data)
        st.wide_basis = LinearInverseModel.fit(wa[:stop], wide.lats, wide.mask, variance=0.999, max_modes=20)
        st.wide_hybrid = HybridLIM.fit(wa[:stop], wide.lats, lead, wide.mask)
    return st


def _stat_forecasts(st: _Stage, lead: int, targets: np.ndarray) -> dict[str, np.ndarray]:
    last, f = st.anom[targets - lead], st.fitted
    out = {"anomaly_persistence": last, "damped_persistence": f["damped_persistence"].predict(last),
           "lim": f["lim"].predict(last, lead), "hybrid": f["hybrid"].predict(last)}  # fmt: skip
    if st.wide is not None:
        out["wide_hybrid"] = st.wide.area(st.wide_hybrid.predict(st.wide_anom[targets - lead]))
        out["blend"] = blend(out["hybrid"], out["wide_hybrid"])
    return out


def _inputs(anom: np.ndarray, targets: np.ndarray, lead: int, months: int) -> np.ndarray:
    """(N, months, H, W) input anomalies, oldest first, the last one `lead` months before each target."""
    return np.stack([anom[targets - lead - k] for k in range(months - 1, -1, -1)], axis=1)


def _fit_ridge(st: _Stage, cal: np.ndarray, lead: int, stop: int, base: str, settings: tuple[Any, ...]) -> Any:
    """One ridge correction of the forecast `base` with `settings` (modes, months, seasonal, alpha, wide modes),
    fitted on the targets before `stop`."""
    modes, months, seasonal, alpha, wmodes = settings
    t = np.arange(lead + max(RIDGE_MONTHS), stop)
    if (base, stop) not in st.errors:
        st.errors[(base, stop)] = st.anom[t] - _stat_forecasts(st, lead, t)[base]
    return RidgeCorrection.fit(
        st.basis, _inputs(st.anom, t, lead, months), cal[t], st.errors[(base, stop)], modes=modes, months=months,
        seasonal=seasonal, alpha=alpha, wide=st.wide_basis if wmodes else None, wide_modes=wmodes,
        wide_inputs=_inputs(st.wide_anom, t, lead, months) if wmodes else None,
    )  # fmt: skip


def _ridge_predict(rc: Any, st: _Stage, cal: np.ndarray, lead: int, targets: np.ndarray) -> np.ndarray:
    wide_in = _inputs(st.wide_anom, targets, lead, rc.months) if rc.wide_modes else None
    return rc.predict(_inputs(st.anom, targets, lead, rc.months), cal[targets], wide_in)


def _ridge_settings(st: _Stage) -> list[tuple]:
    """Every candidate (modes, months, seasonal, alpha, wide modes) the stage's bases allow."""
    wide = WIDE_MODES if st.wide_basis is not None else (0,)
    return [(m, mo, se, al, wm) for m, mo, se, al, wm in itertools.product(RIDGE_MODES, RIDGE_MONTHS, (False, True),
                                                                           RIDGE_ALPHAS, wide)
            if m <= st.basis.modes and not (wm and wm > st.wide_basis.modes)]  # fmt: skip


def pooled_sq_error(pred: np.ndarray, truth: np.ndarray, w: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """(Σ w·err², Σ w) over ocean cells and months: pooled, sqrt(ratio) is `weighted_rmse`."""
    e = (pred[:, mask] - truth[:, mask]) ** 2
    ww = np.broadcast_to(w[:, None], mask.shape)[mask]
    return float(np.sum(e * ww)), float(ww.sum() * e.shape[0])


def rolling_statistical(data: np.ndarray, months: np.ndarray, lats: np.ndarray, mask: np.ndarray, lead: int,
                        years: tuple[int, ...] = ROLLING_YEARS, val_months: int = VAL_MONTHS, log: Any = None,
                        keep_forecasts: bool = False, wide: WideRegion | None = None) -> dict[str, Any]:  # fmt: skip
    """The rolling-origin hindcast of the statistical forecasts for one area and lead (module docstring).

    data: (T, H, W) °C of consecutive months `months` (absolute, year * 12 + month - 1); NaN off `mask`.
    wide: the wide predictor region over the same months (`wide_region`, `WideRegion.build`), or None.
    Returns per-year pooled squared errors of every forecast, the settings chosen for each year, and the index sets
    each stage used (`stages`), so a test can check that no test month was fitted on or chose; `keep_forecasts`:
    also every forecast's anomalies of each test year (`forecasts`)."""
    data = np.where(mask, np.asarray(data, dtype=np.float64), np.nan)
    if wide is not None and len(wide.data) != len(data):
        raise ValueError(f"rolling hindcast: the wide region has {len(wide.data)} months, the area {len(data)}")
    cal, w = months % 12, lat_weights(lats)
    per_year: dict[int, dict[str, tuple[float, float]]] = {}
    chosen: dict[int, dict[str, Any]] = {}
    stages: dict[Any, Any] = {}
    kept: dict[Any, Any] = {}
    for year in years:
        first = int(np.searchsorted(months, year * 12))
        if first >= len(months) or months[first] != year * 12:
            continue
        test_t, val_stop = np.arange(first, min(first + 12, len(months))), first - val_months
        if val_stop < 6 * 12:
            raise ValueError(f"rolling hindcast: year {year} leaves {val_stop} months to fit before its validation")
        # settings: fit on [0, val_stop), choose on the targets [val_stop, first). Each step away from the default
        # base (the first of BASES there is) must beat what it replaces month by month by more than Z standard
        # errors: another base, then a ridge correction of the base. 36 months choosing among many settings would
        # otherwise pick noise (the network's correction scale follows the same rule).
        st, val_t = _fit_stage(data, cal, lats, mask, val_stop, lead, wide), np.arange(val_stop, first)
        fv = _stat_forecasts(st, lead, val_t)
        pm = {b: per_month_sq_error(fv[b], st.anom[val_t], w, mask) for b in BASES if b in fv}
        base, base_gain, base_se = choose_on_validation(pm, lead)
        passed: dict[tuple, float] = {}
        for k in _ridge_settings(st):
            rc = _fit_ridge(st, cal, lead, val_stop, base, k)
            pred = fv[base] + _ridge_predict(rc, st, cal, lead, val_t)
            gain = clear_gain(per_month_sq_error(pred, st.anom[val_t], w, mask), pm[base], lead)
            if gain > 0:
                passed[k] = gain
        # the mean of every passing correction: one setting picked on 36 months is noisy, their average less so
        keys = sorted(passed, key=passed.__getitem__, reverse=True)
        st = _fit_stage(data, cal, lats, mask, first, lead, wide)  # refit on everything before the year
        f = _stat_forecasts(st, lead, test_t)
        corr = [_ridge_predict(_fit_ridge(st, cal, lead, first, base, k), st, cal, lead, test_t) for k in keys]
        f["corrected"] = f[base] + np.mean(corr, axis=0) if keys else f[base]
        chosen[year] = {"base": base, "why": choice_reason(base_gain, base_se, next(iter(pm)))}
        if keys:
            chosen[year].update(zip(("modes", "months", "seasonal", "alpha", "wide_modes"), keys[0]), passed=len(keys))
        # truth as anomalies against the same (pre-year) climatology: the RMSE equals the °C one
        per_year[year] = {k: pooled_sq_error(v, st.anom[test_t], w, mask) for k, v in f.items()}
        if keep_forecasts:
            kept[year] = f
        stages[year] = {"fit_before": int(val_stop), "val": [int(val_stop), int(first)], "test": test_t.tolist()}
        if log:
            log(f"  year {year}: correction {chosen[year]}")
    out = {"per_year": per_year, "chosen": chosen, "stages": stages}
    return {**out, "forecasts": kept} if keep_forecasts else out


def bootstrap_ratio(per_year: dict[int, dict[str, tuple[float, float]]], a: str, b: str, reps: int = 2000,
                    seed: int = 0) -> dict[str, float]:  # fmt: skip
    """RMSE(a) / RMSE(b) - 1 pooled over the years, with a 90 % interval from resampling whole years."""
    ys = sorted(per_year)
    sa, sb = (np.array([per_year[y][k][0] for y in ys]) for k in (a, b))
    idx = np.random.default_rng(seed).integers(0, len(ys), size=(reps, len(ys)))
    lo, hi = np.percentile(np.sqrt(sa[idx].sum(1) / sb[idx].sum(1)) - 1.0, [5, 95])
    return {"ratio": float(np.sqrt(sa.sum() / sb.sum()) - 1.0), "lo": float(lo), "hi": float(hi)}


def pooled_rmse(per_year: dict[int, dict[str, tuple[float, float]]], name: str) -> float:
    return float(np.sqrt(sum(v[name][0] for v in per_year.values()) / sum(v[name][1] for v in per_year.values())))
