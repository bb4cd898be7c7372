"""How much skill do these months hold beyond the LIM? The best statistical forecasts chosen on validation.

    python -m benchmarks.skill_ceiling                # HadISST 5° areas + the built-in sample, leads 1 3 6
    python -m benchmarks.skill_ceiling --quick        # CI: a small generated sample, lead 1

Issue 13 asks the network to be 10 % below the best baseline (the LIM, at every HadISST lead) at lead 1. That
presumes the data hold that much predictable signal beyond a linear propagator of the leading EOFs. This
measures what broader families of forecasts find, each fitted on the training months:
- ridge regressions from the principal components of the last L months (EOFs of the training months,
  sqrt(cos φ)-weighted, of the area itself or of a wider region around it) to every ocean cell of the target
  month (`ridge_area`, `ridge_wide`);
- a nonlinear one: the LIM plus a Gaussian-kernel ridge correction from the area's leading principal components
  (`kernel_lim`).
Every setting (EOFs, L, penalty, kernel width) and the family are chosen on the validation months and scored
once on the test months; a "hindsight" bound (the setting best on the test months) is reported beside it.
Splits, climatology, samples (the CLI's default context, 6 months) and scores (latitude-weighted RMSE and ACC
over ocean cells) are the model's and the baselines'. Deterministic: no seeds. Results:
`benchmarks/results/skill_ceiling_<tag>.{json,md}`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import RESULTS_DIR, environment, md_table, write_json
from benchmarks.skill import DATASETS, add_data_args, quick_sample, resolve_data

MODES = (4, 8, 14, 20, 30, 40, 60)  # EOFs kept as predictors
LAGS = (1, 2, 3, 6)  # input months used (the last L of the context)
ALPHAS = (0.1, 1.0, 10.0, 100.0, 1000.0)  # ridge penalty on the (unit-free) principal components
# A wider predictor region for each data source: the extent of the HadISST 5° file (30°S-30°N, 20°E-60°W).
WIDE = {
    "hadisst5": ((20.0, 300.0), (-30.0, 30.0)),
    "hadisst2": ((20.0, 300.0), (-30.0, 30.0)),
    "sample": ((20.0, 300.0), (-30.0, 30.0)),
}
CONTEXT = 6  # the CLI's default (seq_len 7)
SPLITS = ("train", "val", "test")
FORECASTS = ("damped_persistence", "lim", "ridge_area", "ridge_wide", "kernel_lim")
CHOSEN = FORECASTS[2:]  # the families the validation months choose between


def principal_components(anom: np.ndarray, lats: np.ndarray, mask: np.ndarray, train_stop: int) -> np.ndarray:
    """(T, m) principal components of every month, EOFs from the months [0, train_stop) only."""
    w = np.sqrt(np.clip(np.cos(np.deg2rad(np.asarray(lats, dtype=np.float64))), 0.0, None))
    x = anom[:, mask] * np.broadcast_to(w[:, None], mask.shape)[mask]
    _, _, vt = np.linalg.svd(x[:train_stop], full_matrices=False)
    return x @ vt.T


def _features(pcs: np.ndarray, last: np.ndarray, modes: int, lags: int) -> np.ndarray:
    cols = [pcs[last - k, :modes] for k in range(lags)]
    return np.concatenate([*cols, np.ones((len(last), 1))], axis=1)


def _ridge(f: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    reg = alpha * np.eye(f.shape[1])
    reg[-1, -1] = 0.0  # the intercept is not penalised
    return np.linalg.solve(f.T @ f + reg, f.T @ y)


def choose(settings: Any, predict: Any, score: Any) -> dict[str, Any]:
    """Score `predict(setting)` -> {"val": ..., "test": ...} (N, cells) anomaly forecasts for every setting (a
    dict); keep the one with the lowest validation RMSE. Also returned, under "hindsight": the setting whose *test*
    RMSE is lowest, an optimistic bound on what the family can show that no forecast chosen beforehand reaches."""
    best: dict[str, Any] | None = None
    hindsight: dict[str, Any] | None = None
    for setting in settings:
        pred = predict(setting)
        row = {**setting, "val": score("val", pred["val"]), "test": score("test", pred["test"])}
        if best is None or row["val"]["rmse"] < best["val"]["rmse"]:
            best = row
        if hindsight is None or row["test"]["rmse"] < hindsight["test"]["rmse"]:
            hindsight = row
    if best is None or hindsight is None:
        raise ValueError("choose: no setting fits these samples")
    return {**best, "hindsight": hindsight}


def ridge_ceiling(
    anom: np.ndarray,
    mask: np.ndarray,
    samples: dict[str, tuple[np.ndarray, np.ndarray]],
    score: Any,
    pcs: np.ndarray,
    modes: tuple[int, ...] = MODES,
    lags: tuple[int, ...] = LAGS,
    alphas: tuple[float, ...] = ALPHAS,
) -> dict[str, Any]:
    """Ridge forecasts of the target months' anomalies (ocean cells of `mask`) from the principal components of
    the last `lags` months, fitted on the training samples, for every (modes, lags, alpha), through `choose`.

    `samples[split]` = (index of each sample's last input month, index of its target month) into `anom`/`pcs`;
    `score(split, pred_anom)` returns {"rmse": ..., "acc": ...} for (N, cells) anomaly forecasts."""
    y_train = anom[samples["train"][1]][:, mask]
    first_input = min(int(samples[s][0].min()) for s in samples if len(samples[s][0]))
    settings = [
        {"modes": m, "lags": lag, "alpha": a}
        for m, lag, a in itertools.product(modes, lags, alphas)
        if m <= pcs.shape[1] and lag - 1 <= first_input  # enough EOFs; no lag before the file's first month
    ]

    def predict(st: dict[str, Any]) -> dict[str, np.ndarray]:
        coef = _ridge(_features(pcs, samples["train"][0], st["modes"], st["lags"]), y_train, st["alpha"])
        return {s: _features(pcs, samples[s][0], st["modes"], st["lags"]) @ coef for s in ("val", "test")}

    return choose(settings, predict, score)


def kernel_ceiling(
    anom: np.ndarray,
    mask: np.ndarray,
    samples: dict[str, tuple[np.ndarray, np.ndarray]],
    score: Any,
    pcs: np.ndarray,
    prior: dict[str, np.ndarray],
    modes: tuple[int, ...] = (2, 4, 8, 14),
    lags: tuple[int, ...] = (1, 2),
    widths: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0),
    alphas: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0),
) -> dict[str, Any]:
    """A nonlinear family: Gaussian-kernel ridge regression from the standardised principal components of the last
    `lags` months to what the `prior` forecast (split -> (N, cells) anomalies, e.g. the LIM's) leaves over; the
    forecast is prior + that correction, chosen through `choose`. `widths` scale the kernel's length with
    sqrt(features)."""
    z = pcs / (pcs[: int(samples["train"][1].max()) + 1].std(0) + 1e-12)
    resid = anom[samples["train"][1]][:, mask] - prior["train"]
    first_input = min(int(samples[s][0].min()) for s in samples if len(samples[s][0]))
    settings = [
        {"modes": m, "lags": lag, "width": w, "alpha": a}
        for m, lag, w, a in itertools.product(modes, lags, widths, alphas)
        if m <= pcs.shape[1] and lag - 1 <= first_input
    ]

    def feats(split: str, st: dict[str, Any]) -> np.ndarray:
        return np.concatenate([z[samples[split][0] - k, : st["modes"]] for k in range(st["lags"])], axis=1)

    def kernel(a: np.ndarray, b: np.ndarray, st: dict[str, Any]) -> np.ndarray:
        d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
        return np.exp(-d2 / (2 * st["width"] ** 2 * a.shape[1]))

    def predict(st: dict[str, Any]) -> dict[str, np.ndarray]:
        f_train = feats("train", st)
        k = kernel(f_train, f_train, st)
        dual = np.linalg.solve(k + st["alpha"] * np.eye(len(k)), resid)
        return {s: prior[s] + kernel(feats(s, st), f_train, st) @ dual for s in ("val", "test")}

    return choose(settings, predict, score)


def evaluate_area(
    data_path: str | None,
    lon: tuple[float, float],
    lat: tuple[float, float],
    resolution: float,
    lead: int,
    wide: tuple[tuple[float, float], tuple[float, float]] | None,
    cache_dir: str | None = None,
) -> dict[str, Any]:
    """The LIM, damped persistence, the ridge ceiling (area and wide predictors) and the kernel correction of the
    LIM for one area and lead."""
    from datasets.era5 import ERA5SSTMonthlyDataset
    from utils.baselines import baseline_forecasts, fit_baselines
    from utils.metrics import acc, weighted_rmse

    def open_splits(lo: tuple[float, float], la: tuple[float, float]) -> dict[str, Any]:
        kw: dict[str, Any] = dict(
            lon=list(lo), lat=list(la), resolution=resolution, seq_len=CONTEXT + 1, offset=lead - 1
        )
        return {s: ERA5SSTMonthlyDataset(split=s, data_path=data_path, cache_dir=cache_dir, **kw) for s in SPLITS}

    ds = open_splits(lon, lat)
    train = ds["train"]
    mask = train.ocean_mask.numpy()
    anom = train.anomalies_c()
    samples = {s: d.sample_months() for s, d in ds.items()}
    refs = {s: ds[s].reference_c() for s in ("val", "test")}

    def score_c(split: str, pred_c: np.ndarray) -> dict[str, float]:
        r = refs[split]
        return {
            "rmse": weighted_rmse(pred_c, r["truth_c"], train.lats, mask),
            "acc": acc(pred_c, r["truth_c"], r["clim_target_c"], train.lats, mask),
        }

    def score(split: str, pred_anom: np.ndarray) -> dict[str, float]:
        full = np.full(refs[split]["truth_c"].shape, np.nan)
        full[:, mask] = pred_anom
        return score_c(split, refs[split]["clim_target_c"] + full)

    train_anom = train.train_anomalies_c()
    stop = len(train_anom)  # EOFs from the months training samples touch, as the LIM's
    fitted = fit_baselines(train_anom, train.lats, mask, lead)
    out: dict[str, Any] = {"lead": lead, "test_samples": len(ds["test"]), "lim_modes": fitted["lim"].modes}
    for name in ("damped_persistence", "lim"):
        out[name] = {}
        for split, r in refs.items():
            f = baseline_forecasts(fitted, lead, r["last_input_c"], r["clim_target_c"], r["clim_input_c"])
            out[name][split] = score_c(split, f[name])
    pcs_area = principal_components(anom, train.lats, mask, stop)
    out["ridge_area"] = ridge_ceiling(anom, mask, samples, score, pcs_area)
    lim_prior = {s: fitted["lim"].predict(anom[samples[s][0]], lead)[:, mask] for s in SPLITS}
    out["kernel_lim"] = kernel_ceiling(anom, mask, samples, score, pcs_area, lim_prior)
    if wide is not None:
        w = open_splits(*wide)["train"]
        if not np.array_equal(w.months, train.months):
            raise ValueError(f"wide region {wide}: not the same months as the area")
        wa = w.anomalies_c()
        pcs = principal_components(wa, w.lats, w.ocean_mask.numpy(), stop)
        out["ridge_wide"] = ridge_ceiling(anom, mask, samples, score, pcs)
        out["wide_region"] = {"lon": list(wide[0]), "lat": list(wide[1])}
    return out


def model_rmse(skill_json: Path, dataset: str, lead: int) -> float | None:
    """The network's mean test RMSE at the CLI's default context from a committed skill run, if there is one."""
    if not skill_json.is_file():
        return None
    block = json.loads(skill_json.read_text()).get("datasets", {}).get(dataset, {})
    for row in block.get("summary", []):
        if row["lead"] == lead and row["context"] == CONTEXT:
            return float(row["model_rmse"]["mean"])
    return None


def render(result: dict[str, Any]) -> str:
    header = ["data", "lead", "test months", *(f"{n} (test RMSE)" for n in FORECASTS), "chosen on val"]
    header += ["chosen vs LIM", "hindsight bound vs LIM", "model (skill_cpu.json, context 6)"]
    rows = []
    for name, block in result["datasets"].items():
        for r in block["leads"]:
            lim = r["lim"]["test"]["rmse"]
            fams = [k for k in CHOSEN if k in r]
            best = min(fams, key=lambda k: r[k]["val"]["rmse"])  # chosen on validation, like the settings
            chosen = r[best]
            how = ", ".join(f"{k} {v:g}" for k, v in chosen.items() if isinstance(v, (int, float)))
            model = r.get("model_rmse")
            rows.append(
                [
                    name,
                    r["lead"],
                    r["test_samples"],
                    *(f"{r[n]['test']['rmse']:.4f}" if n in r else "-" for n in FORECASTS),
                    f"{best}: {how}",
                    f"{100 * (chosen['test']['rmse'] / lim - 1):+.1f} %",
                    f"{100 * (min(r[k]['hindsight']['test']['rmse'] for k in fams) / lim - 1):+.1f} %",
                    "-" if model is None else f"{model:.4f} ({100 * (model / lim - 1):+.1f} % vs LIM)",
                ]
            )
    return (
        "Test RMSE (°C, latitude-weighted over ocean cells). Each family's settings and the family itself are "
        "chosen on the validation months; 'chosen vs LIM' is that choice's test RMSE against the LIM's. 'Hindsight "
        "bound': the lowest test RMSE of any setting of any family, picked on the test months themselves — "
        "optimistic, no forecast made beforehand can claim it.\n\n" + md_table(header, rows) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_args(p)
    p.add_argument("--quick", action="store_true", help="CI: a small generated sample, lead 1")
    p.add_argument("--tag", default="cpu", help="results go to benchmarks/results/skill_ceiling_<tag>.{json,md}")
    p.add_argument("--out", default=None, help="results path (default: benchmarks/results/skill_ceiling_<tag>.json)")
    args = p.parse_args(argv)
    if min(args.leads) < 1:
        p.error(f"--leads {args.leads}: every value must be >= 1")
    specs = {n: DATASETS[n] for n in args.datasets}
    cache_dir = None
    tmp = tempfile.TemporaryDirectory(prefix="plainloop-ceiling-")
    if args.quick:
        specs = quick_sample(Path(tmp.name))
        args.leads, cache_dir = [1], str(Path(tmp.name) / "cache")
    skill_json = RESULTS_DIR / f"skill_{args.tag}.json"
    result: dict[str, Any] = {
        "benchmark": "skill_ceiling",
        "environment": environment(torch.device("cpu")),
        "datasets": {},
    }
    result["grid"] = {"modes": MODES, "lags": LAGS, "alphas": ALPHAS, "context": CONTEXT}
    for name, (source, lon, lat, res) in specs.items():
        path = resolve_data(source, cache_dir)
        leads = []
        for lead in args.leads:
            wide = WIDE.get("sample" if args.quick else source)  # the quick file is a global sample too
            r = evaluate_area(path, lon, lat, res, lead, wide, cache_dir=cache_dir)
            r["model_rmse"] = model_rmse(skill_json, name, lead)
            leads.append(r)
            print(f"[ceiling] {name} lead {lead}: lim {r['lim']['test']['rmse']:.4f}", end="")
            for k in CHOSEN:
                if k in r:
                    print(f" {k} {r[k]['test']['rmse']:.4f} (val {r[k]['val']['rmse']:.4f})", end="")
            print(flush=True)
        result["datasets"][name] = {"source": source, "lon": lon, "lat": lat, "resolution": res, "leads": leads}
    tmp.cleanup()
    out = Path(args.out) if args.out else RESULTS_DIR / f"skill_ceiling_{args.tag}.json"
    write_json(out, result)
    md = out.with_suffix(".md")
    md.write_text(f"# Skill ceiling of linear forecasts\n\n{render(result)}")
    print(render(result))
    print(f"[ceiling] wrote {out} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
