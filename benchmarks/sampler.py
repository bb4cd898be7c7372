"""Sampler benchmark: CachedModalAwarePKSampler vs per-batch modality inference (seed 004's "before").

    python -m benchmarks.sampler                     # writes benchmarks/results/sampler_cpu.json
    python -m benchmarks.sampler --reps 30 --before_reps 3

Two metadata sets, no images (the sampler only ever sees metadata):
- "sysu": SYSU-MM01 training size, 22,258 RGB + 11,909 IR samples of 395 identities, RGB cams 1/2/4/5, IR 3/6.
- "seed004": seed 004's set, 14,910 samples of 320 identities, 285 of them with IR (35 RGB-only).
Batch 32 = 8 identities x 4 instances. Measured per repetition:
- construction: reading the metadata arrays + building the index (the metadata log line included);
- epoch: `list(sampler)` after `set_epoch`, i.e. every batch of one epoch as Python lists;
- before: the same epoch (same identity order, same P x K) built the seed-004 way, where the modality of a
  sample is inferred when a batch needs it, through `infer_modalities_of_sample(i)` (here a path parse,
  `cam3/0007/0012.jpg` -> {"ir"}, no file I/O, so the "before" is if anything flattered). Two variants:
  "per-sample": only the P x K drawn samples are inferred, plus a scan of the identity's samples when the
  draw lacks RGB or IR (the whole identity when it has none), close to the seed's own count of calls; "per-identity": each identity's RGB/IR lists are rebuilt for each batch
  (every sample of each batch identity inferred).
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import sys
import time
from typing import Any

import numpy as np
import torch

from benchmarks.common import RESULTS_DIR, environment, md_table, stats, write_json
from datasets.cached_sampler import CachedModalAwarePKSampler

_CAM_RE = re.compile(r"cam(\d)/")
IR_CAMS = {3, 6}


class PathMeta:
    """Metadata of a re-ID set as arrays (what the cached sampler reads) and as paths (what the seed's
    per-sample inference parsed)."""

    def __init__(self, name: str, rgb_per_id: np.ndarray, ir_per_id: np.ndarray, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        pids, cams, mods = [], [], []
        for pid, (nr, ni) in enumerate(zip(rgb_per_id, ir_per_id)):
            pids += [pid] * int(nr + ni)
            cams += rng.choice([1, 2, 4, 5], int(nr)).tolist() + rng.choice([3, 6], int(ni)).tolist()
            mods += ["rgb"] * int(nr) + ["ir"] * int(ni)
        order = rng.permutation(len(pids))  # file lists interleave identities
        self.name = name
        self.pids = np.asarray(pids)[order]
        self.camids = np.asarray(cams)[order]
        self.modalities = np.asarray(mods)[order]
        counter: dict[int, int] = {}
        self.img_paths = []
        for p, c in zip(self.pids.tolist(), self.camids.tolist()):
            counter[p] = counter.get(p, 0) + 1
            self.img_paths.append(f"cam{c}/{p:04d}/{counter[p]:04d}.jpg")
        self.calls = 0

    def __len__(self) -> int:
        return len(self.pids)

    def infer_modalities_of_sample(self, i: int) -> set[str]:
        """The seed's per-sample inference: from the file path, every time it is asked."""
        self.calls += 1
        cam = int(_CAM_RE.match(self.img_paths[i]).group(1))  # type: ignore[union-attr]
        return {"ir"} if cam in IR_CAMS else {"rgb"}


def split_counts(total: int, n_ids: int, rng: np.random.Generator, low: int) -> np.ndarray:
    """`total` samples over `n_ids` identities, each with at least `low`."""
    extra = rng.multinomial(total - low * n_ids, rng.dirichlet(np.full(n_ids, 5.0)))
    return extra + low


def make_sets(seed: int = 0) -> list[PathMeta]:
    rng = np.random.default_rng(seed)
    sysu = PathMeta("sysu", split_counts(22258, 395, rng, 10), split_counts(11909, 395, rng, 4), seed)
    # seed 004: 14,910 samples, 320 ids, 285 pairable; RGB:IR about 2:1 as in SYSU-MM01
    n_ir = 4900
    ir = np.r_[split_counts(n_ir, 285, rng, 2), np.zeros(35, dtype=np.int64)]
    rgb = split_counts(14910 - n_ir, 320, rng, 4)
    return [sysu, PathMeta("seed004", rgb, ir, seed)]


def time_sampler(
    ds: Any, reps: int, **kw: Any
) -> tuple[list[float], list[float], CachedModalAwarePKSampler, list[list[int]]]:
    """Seconds to construct CachedModalAwarePKSampler(ds, **kw) and to draw one epoch (epoch r in repetition r),
    `reps` times; also the last sampler and the batches of its epoch."""
    cons, epoch = [], []
    for r in range(reps):
        t0 = time.perf_counter()
        s = CachedModalAwarePKSampler(ds, **kw)
        cons.append(time.perf_counter() - t0)
        s.set_epoch(r)
        t0 = time.perf_counter()
        batches = list(s)
        epoch.append(time.perf_counter() - t0)
        assert len(batches) == len(s)
    return cons, epoch, s, batches


def before_epoch(ds: PathMeta, sampler: CachedModalAwarePKSampler, epoch: int, variant: str) -> list[list[int]]:
    """The same epoch (identity order and P x K) with modalities inferred per batch, seed-004 style."""
    P, K = sampler.num_ids_per_batch, sampler.num_instances
    seq = sampler._id_sequence(sampler._rng(epoch))  # same identities per batch as the cached sampler
    pids_of = sampler.eligible_pids[seq]
    # the pid -> indices map is built once here (generous to the "before")
    by_pid: dict[int, list[int]] = {}
    for i, p in enumerate(ds.pids.tolist()):
        by_pid.setdefault(p, []).append(i)
    rnd = random.Random(epoch)
    batches: list[list[int]] = []
    for b in range(len(pids_of) // P):
        batch: list[int] = []
        for pid in pids_of[b * P : (b + 1) * P].tolist():
            idxs = by_pid[pid]
            if variant == "per-identity":
                rgb = [i for i in idxs if "rgb" in ds.infer_modalities_of_sample(i)]
                ir = [i for i in idxs if "ir" in ds.infer_modalities_of_sample(i)]
                pick = [rnd.choice(rgb)] + ([rnd.choice(ir)] if ir else [])
                rest = [i for i in idxs if i not in pick]
                pick += (
                    rnd.sample(rest, K - len(pick))
                    if len(rest) >= K - len(pick)
                    else rnd.choices(idxs, k=K - len(pick))
                )
            else:  # per-sample: infer the K drawn samples; if a modality is missing, scan for it
                pick = rnd.sample(idxs, K) if len(idxs) >= K else rnd.choices(idxs, k=K)
                mods = [ds.infer_modalities_of_sample(i) for i in pick]
                for slot, want in ((0, "rgb"), (1, "ir")):
                    if slot < K and not any(want in m for m in mods):
                        for i in rnd.sample(idxs, len(idxs)):  # until found; all of them if it has none
                            if want in ds.infer_modalities_of_sample(i):
                                pick[slot], mods[slot] = i, {want}
                                break
            batch += pick
        batches.append(batch)
    return batches


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30, help="repetitions of construction and epoch (default: 30)")
    ap.add_argument("--before_reps", type=int, default=3, help="repetitions of the slow 'before' epoch (default: 3)")
    ap.add_argument("--batch_size", type=int, default=32, help="P x K (default: 32)")
    ap.add_argument("--num_instances", type=int, default=4, help="K (default: 4)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "sampler_cpu.json"), help="JSON path (default: %(default)s)")
    args = ap.parse_args(argv)
    logging.getLogger("datasets.cached_sampler").setLevel(logging.WARNING)  # the summary line is timed too

    sets = make_sets()
    results: dict[str, Any] = {
        "environment": environment(torch.device("cpu")),
        "config": vars(args),
        "sets": {},
    }
    rows = []
    for ds in sets:
        kw = {"batch_size": args.batch_size, "num_instances": args.num_instances, "seed": 42}
        t0 = time.perf_counter()
        first = CachedModalAwarePKSampler(ds, **kw)
        cold = time.perf_counter() - t0
        cons, epoch_t, _, _ = time_sampler(ds, args.reps, **kw)
        before: dict[str, Any] = {}
        for variant in ("per-sample", "per-identity"):
            times, calls = [], []
            for r in range(args.before_reps):
                ds.calls = 0
                t0 = time.perf_counter()
                bb = before_epoch(ds, first, r, variant)
                times.append(time.perf_counter() - t0)
                calls.append(ds.calls)
                assert len(bb) == first.num_batches
            before[variant] = {"seconds": times, "stats": stats(times), "infer_calls": calls}
        # a Python list of modality strings instead of a numpy array (one conversion at construction)
        as_list = type(
            "L",
            (),
            {
                "pids": ds.pids.tolist(),
                "camids": ds.camids.tolist(),
                "modalities": ds.modalities.tolist(),
                "__len__": lambda self: len(self.pids),
            },
        )()
        list_t = []
        for _ in range(max(3, args.reps // 3)):
            t0 = time.perf_counter()
            CachedModalAwarePKSampler(as_list, **kw)
            list_t.append(time.perf_counter() - t0)
        entry: dict[str, Any] = {
            "samples": len(ds), "summary": first.summary, "construction_cold_s": cold, "construction_s": cons,
            "construction": stats(cons), "epoch_s": epoch_t, "epoch": stats(epoch_t),
            "construction_from_python_lists_s": list_t, "construction_from_python_lists": stats(list_t),
            "before": before,
            "speedup_epoch_vs_before": {v: before[v]["stats"]["median"] / stats(epoch_t)["median"] for v in before},
        }  # fmt: skip
        results["sets"][ds.name] = entry
        ms = 1e3
        rows.append(
            [
                ds.name, len(ds), first.num_ids, first.summary["pairable_ids"], first.num_batches,
                f"{entry['construction']['median'] * ms:.2f} ({cold * ms:.1f} cold)",
                f"{entry['epoch']['median'] * ms:.2f}",
                f"{before['per-sample']['stats']['median'] * ms:.0f} ({before['per-sample']['infer_calls'][0]:,} calls)",
                f"{before['per-identity']['stats']['median'] * ms:.0f} ({before['per-identity']['infer_calls'][0]:,} calls)",
                f"{entry['speedup_epoch_vs_before']['per-sample']:.0f}x / {entry['speedup_epoch_vs_before']['per-identity']:.0f}x",
            ]
        )  # fmt: skip
    path = write_json(args.out, results)
    print(md_table(["set", "samples", "ids", "pairable", "batches/epoch", "construction ms (median)",
                    "epoch ms (median)", "before per-sample ms", "before per-identity ms",
                    "speed-up (per-sample / per-identity)"], rows))  # fmt: skip
    print(f"\nraw: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
