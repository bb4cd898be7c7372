"""What the per-epoch last.pt costs the loop, and where a save's time goes.

    python -m benchmarks.checkpoint_cost --preset seed        # a GPU box: the seed's configuration
    python -m benchmarks.checkpoint_cost --preset tiny        # any machine, a minute

With short epochs (the seed's 479 samples are 4 steps of 150) a save after every epoch can cost as much as the
epoch's steps. This runs benchmarks.run's "defaults" row (plainloop's Trainer, TrainConfig defaults) in variants,
interleaved, each writing last.pt at every epoch end (checkpoint_interval=0), and times the save's parts inside the
real loop:
  as_is        the save as shipped (on a GPU: last.pt written from a background thread, async_checkpoint)
  in_line      async_checkpoint=False: every save written before training goes on
  no_save      the per-epoch last.pt skipped (the final one is still written): the upper bound of any fix
  no_fsync     os.fsync skipped (durability off): what the disk's flush costs
  no_digest    the sha256 digest skipped: what hashing the state costs
Per save: Checkpointer.save (what the loop waits for; the GPU's queued work is synchronised first, so it is not
counted), state_digest, torch.save and os.fsync. Writes raw JSON and a Markdown table to --out.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import RESULTS_DIR, comma_list, environment, md_table, parser, stats, swapped, sync, write_result
from benchmarks.run import PRESETS, Bench, _build_task, epochs_from_metrics, prepare_data

VARIANTS = ("as_is", "in_line", "no_save", "no_fsync", "no_digest")
FLAGS = [("--preset", "tiny", "problem size", {"choices": sorted(PRESETS)}),
         ("--reps", 2, "interleaved repetitions"), ("--variants", ",".join(VARIANTS), "comma list"),
         ("--cache-dir", None, "generated data and cache"), ("--out", None, "JSON path")]  # fmt: skip


def _patched(variant: str, device: torch.device, phases: dict[str, list[float]], epochs: int) -> contextlib.ExitStack:
    """The variant's change and timers around the save's parts, undone when the returned stack closes."""
    import trainer.support.checkpoint_file as ck
    from trainer.state import Checkpointer

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

    def skip_epoch_saves(self: Any, name: str, run_dir: Path, files: Any, **kw: Any) -> Path:
        if name == "last.pt" and self.progress.epoch < epochs:
            return run_dir / "checkpoints" / name
        return orig_save(self, name, run_dir, files, **kw)

    stack = contextlib.ExitStack()
    for obj, name, new in (
        (Checkpointer, "save", skip_epoch_saves if variant == "no_save" else timed("save", orig_save, pre_sync=True)),
        (os, "fsync", (lambda fd: None) if variant == "no_fsync" else timed("fsync", os.fsync)),
        (ck, "state_digest", (lambda obj: "sha256:" + "0" * 64) if variant == "no_digest" else
         timed("digest", ck.state_digest)),
        (torch, "save", timed("torch_save", torch.save)),
    ):  # fmt: skip
        stack.enter_context(swapped(obj, name, new))
    return stack


def run_variant(b: Bench, variant: str, batch: int) -> dict[str, Any]:
    from trainer import TrainConfig, Trainer

    W, E = b.p["warmup_epochs"], b.p["epochs"]
    phases: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(epochs=W + E, batch_size=batch, output_dir=tmp, run_name=variant, seed=b.seed,
                          device=str(b.device), async_checkpoint=False if variant == "in_line" else None,
                          checkpoint_interval=0.0)  # fmt: skip
        trainer = Trainer(cfg, _build_task(b, None), log=lambda m: None)
        with _patched(variant, b.device, phases, W + E):
            run_dir = Path(trainer.fit()["run_dir"])
        r = epochs_from_metrics(run_dir / "metrics.jsonl", W, E, batch, variant)
        ckpt = run_dir / "checkpoints" / "last.pt"
        size_mb = ckpt.stat().st_size / 1e6 if ckpt.is_file() else None
    return {"variant": variant, "wall_s": r["wall_s"], "samples_per_s": r["samples"] / r["wall_s"],
            "epoch_ms": 1000 * r["wall_s"] / E, "step_ms": 1000 * r["step_s"] / max(1, r["steps"]),
            "outside_steps_frac": max(0.0, 1.0 - r["step_s"] / r["wall_s"]), "checkpoint_mb": size_mb,
            "phases_ms": {k: [1000 * x for x in v] for k, v in phases.items()}}  # fmt: skip


def render(result: dict[str, Any]) -> str:
    def med(runs: list[dict[str, Any]], key: str) -> float:
        return stats([r[key] for r in runs])["median"]

    runs, env = result["runs"], result["environment"]
    base = med(runs["as_is"], "epoch_ms") if runs.get("as_is") else None
    rows = [[v, f"{med(rs, 'samples_per_s'):.1f}", f"{med(rs, 'epoch_ms'):.1f}",
             f"{med(rs, 'epoch_ms') - base:+.1f}" if base else "", f"{100 * med(rs, 'outside_steps_frac'):.1f}%"]
            for v, rs in runs.items() if rs]  # fmt: skip
    text = [f"**{result['preset']}** preset on {env['device_name']}, torch {env['torch']}, commit "
            f"`{env['commit'][:12]}`: plainloop defaults, batch {result['batch']}, {result['epochs']} timed epochs of "
            f"{result['steps_per_epoch']} steps, {result['reps']} interleaved repetitions; checkpoint "
            f"{result['checkpoint_mb']:.1f} MB.", "",
            md_table(["variant", "samples/s (median)", "ms/epoch", "vs as_is", "outside steps"], rows), ""]  # fmt: skip
    for v in ("as_is", "in_line"):
        ph: dict[str, list[float]] = defaultdict(list)
        for r in runs.get(v, []):
            for k, x in r["phases_ms"].items():
                ph[k].extend(x)
        if ph:
            text += [f"Inside the loop ({v}, every save of every repetition; ms):", "",
                     md_table(["part", "calls", "median ms", "max ms"], [[k, len(x), f"{stats(x)['median']:.1f}",
                              f"{max(x):.1f}"] for k, x in sorted(ph.items()) if x]), ""]  # fmt: skip
    return "\n".join(text) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = parser(__doc__, FLAGS)
    args = ap.parse_args(argv)
    variants = comma_list(ap, "--variants", args.variants, VARIANTS)
    p, device = dict(PRESETS[args.preset]), torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cache, data = prepare_data(args.cache_dir, p)
    b, env = Bench(data, p, cache, device, 0), environment(device)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for rep in range(args.reps):
        for v in variants:
            runs[v].append(r := run_variant(b, v, p["batch"]))
            print(f"[ckpt] rep {rep + 1}/{args.reps} {v:10s} {r['samples_per_s']:8.1f} samples/s "
                  f"{r['epoch_ms']:7.1f} ms/epoch", flush=True)  # fmt: skip
    sizes = [r["checkpoint_mb"] for rs in runs.values() for r in rs if r["checkpoint_mb"]]
    result = {"benchmark": "checkpoint_cost", "preset": args.preset, "environment": env, "batch": p["batch"],
              "epochs": p["epochs"], "steps_per_epoch": -(-len(_build_task(b, False).train_set) // p["batch"]),
              "reps": args.reps, "checkpoint_mb": max(sizes) if sizes else 0.0, "runs": runs}  # fmt: skip
    out = Path(args.out) if args.out else RESULTS_DIR / f"checkpoint_cost_{device.type.replace('cuda', 'gpu')}.json"
    write_result(out, result, render(result))
    return result


if __name__ == "__main__":
    main()
