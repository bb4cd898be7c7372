"""What the per-epoch last.pt costs the loop, and where a save's time goes.

    python -m benchmarks.checkpoint_cost --preset seed        # a GPU box: the seed's configuration
    python -m benchmarks.checkpoint_cost --preset tiny        # any machine, a minute

With short epochs (the seed's 479 samples are 4 steps of 150) a save after every epoch can cost as much as the
epoch's steps. This runs benchmarks.run's "defaults" row (plainloop's Trainer, TrainConfig defaults) in
variants, interleaved, and times the save's parts inside the real loop. Every variant but by_time writes last.pt
at every epoch end (checkpoint_interval=0), the cadence this measures:

  as_is        the save as shipped (on a GPU: last.pt written from a background thread, async_checkpoint)
  in_line      async_checkpoint=False: every save written before training goes on
  no_save      the per-epoch last.pt skipped (the final one is still written): the upper bound of any fix
  no_fsync     os.fsync skipped (durability off): what the disk's flush costs
  no_digest    the sha256 digest skipped: what hashing the state costs
  by_time      the defaults' cadence: last.pt every checkpoint_interval seconds (60), at the end and on a stop

Per save (as_is, measured inside the loop; the GPU's queued work is synchronised before each timer starts, so
it is not counted): Checkpointer.save (what the loop waits for), state_digest, torch.save and os.fsync (every
file's; in the background thread when the write is). Writes raw JSON and a
Markdown table to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import RESULTS_DIR, environment, md_table, sync, write_result
from benchmarks.run import PRESETS, Bench, _build_task, epochs_from_metrics

VARIANTS = ("as_is", "in_line", "no_save", "no_fsync", "no_digest", "by_time")


@contextlib.contextmanager
def _patched(variant: str, device: torch.device, phases: dict[str, list[float]], epochs: int) -> Iterator[None]:
    """Install the variant's change and timers around the save's parts; undo both on exit."""
    import os

    import trainer.checkpoint as ck
    from trainer.state import Checkpointer

    saved: list[tuple[Any, str, Any]] = []

    def swap(obj: Any, name: str, new: Any) -> None:
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, new)

    def timed(key: str, fn: Callable[..., Any], pre_sync: bool = False) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            if pre_sync:
                sync(device)
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[key].append(time.perf_counter() - t)

        return wrapper

    orig_save = Checkpointer.save
    if variant == "no_save":

        def save(self: Any, name: str, run_dir: Path, files: Any, **kw: Any) -> Path:
            if name == "last.pt" and self.progress.epoch < epochs:
                return run_dir / "checkpoints" / name
            return orig_save(self, name, run_dir, files, **kw)

        swap(Checkpointer, "save", save)
    else:
        swap(Checkpointer, "save", timed("save", orig_save, pre_sync=True))
    if variant == "no_fsync":
        swap(os, "fsync", lambda fd: None)
    else:
        swap(os, "fsync", timed("fsync", os.fsync))
    if variant == "no_digest":
        swap(ck, "state_digest", lambda obj: "sha256:" + "0" * 64)
    else:
        swap(ck, "state_digest", timed("digest", ck.state_digest))
    swap(torch, "save", timed("torch_save", torch.save))
    try:
        yield
    finally:
        for obj, name, old in reversed(saved):
            setattr(obj, name, old)


def run_variant(b: Bench, variant: str, batch: int) -> dict[str, Any]:
    from trainer import TrainConfig, Trainer

    task = _build_task(b, None)
    W, E = b.p["warmup_epochs"], b.p["epochs"]
    phases: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(
            epochs=W + E, batch_size=batch, output_dir=tmp, run_name=variant, seed=b.seed, device=str(b.device),
            async_checkpoint=False if variant == "in_line" else None,
            checkpoint_interval=TrainConfig.checkpoint_interval if variant == "by_time" else 0.0,
        )  # fmt: skip
        trainer = Trainer(cfg, task, log=lambda m: None)
        with _patched(variant, b.device, phases, W + E):
            summary = trainer.fit()
        r = epochs_from_metrics(Path(summary["run_dir"]) / "metrics.jsonl", W, E, batch, variant)
        ckpt = Path(summary["run_dir"]) / "checkpoints" / "last.pt"
        size_mb = ckpt.stat().st_size / 1e6 if ckpt.is_file() else None
    return {
        "variant": variant,
        "wall_s": r["wall_s"],
        "samples_per_s": r["samples"] / r["wall_s"],
        "epoch_ms": 1000 * r["wall_s"] / E,
        "step_ms": 1000 * r["step_s"] / max(1, r["steps"]),
        "outside_steps_frac": max(0.0, 1.0 - r["step_s"] / r["wall_s"]),
        "checkpoint_mb": size_mb,
        "phases_ms": {k: [1000 * x for x in v] for k, v in phases.items()},
    }


def render(result: dict[str, Any]) -> str:
    rows = []
    base = statistics.median(r["epoch_ms"] for r in result["runs"]["as_is"])
    for v in VARIANTS:
        runs = result["runs"].get(v)
        if not runs:
            continue
        ep = statistics.median(r["epoch_ms"] for r in runs)
        sps = statistics.median(r["samples_per_s"] for r in runs)
        out = statistics.median(r["outside_steps_frac"] for r in runs)
        rows.append([v, f"{sps:.1f}", f"{ep:.1f}", f"{ep - base:+.1f}", f"{100 * out:.1f}%"])
    text = [
        f"**{result['preset']}** preset on {result['environment']['device_name']}, torch "
        f"{result['environment']['torch']}, commit `{result['environment']['commit'][:12]}`: plainloop defaults, "
        f"batch {result['batch']}, {result['epochs']} timed epochs of {result['steps_per_epoch']} steps, "
        f"{result['reps']} interleaved repetitions; checkpoint {result['checkpoint_mb']:.1f} MB.",
        "",
        md_table(["variant", "samples/s (median)", "ms/epoch", "vs as_is", "outside steps"], rows),
        "",
    ]
    for v in ("as_is", "in_line"):
        ph: dict[str, list[float]] = defaultdict(list)
        for r in result["runs"].get(v, []):
            for k, x in r["phases_ms"].items():
                ph[k].extend(x)
        if not ph:
            continue
        text += [
            f"Inside the loop ({v}, every save of every repetition; ms):",
            "",
            md_table(
                ["part", "calls", "median ms", "max ms"],
                [[k, str(len(x)), f"{statistics.median(x):.1f}", f"{max(x):.1f}"] for k, x in sorted(ph.items()) if x],
            ),
            "",
        ]
    return "\n".join(text) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from datasets.era5 import default_cache_dir
    from datasets.era5_sample import ensure_sample_file

    p = dict(PRESETS[args.preset])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    data = ensure_sample_file(cache, years=p["years"], grid=p["file_grid"])
    b = Bench(data, p, cache, device, 0)
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {bad}; choose from {VARIANTS}")
    env = environment(device)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for rep in range(args.reps):
        for v in variants:
            r = run_variant(b, v, p["batch"])
            runs[v].append(r)
            print(f"[ckpt] rep {rep + 1}/{args.reps} {v:10s} {r['samples_per_s']:8.1f} samples/s "
                  f"{r['epoch_ms']:7.1f} ms/epoch", flush=True)  # fmt: skip
    n_train = len(_build_task(b, False).train_set)
    sizes = [r["checkpoint_mb"] for rs in runs.values() for r in rs if r["checkpoint_mb"]]
    result = {
        "benchmark": "checkpoint_cost",
        "preset": args.preset,
        "environment": env,
        "batch": p["batch"],
        "epochs": p["epochs"],
        "steps_per_epoch": -(-n_train // p["batch"]),
        "reps": args.reps,
        "checkpoint_mb": max(sizes) if sizes else 0.0,
        "runs": runs,
    }
    tag = "gpu" if device.type == "cuda" else "cpu"
    out = Path(args.out) if args.out else RESULTS_DIR / f"checkpoint_cost_{tag}.json"
    write_result(out, result, render(result))
    print(render(result))
    return result


if __name__ == "__main__":
    main()
