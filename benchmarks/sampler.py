"""Sampler benchmark: CachedModalAwarePKSampler against per-batch modality inference (the seed guides' "before").

    python -m benchmarks.sampler                     # writes benchmarks/results/sampler_cpu.json
    python -m benchmarks.sampler --reps 30 --before_reps 3

Two metadata sets, no images (the sampler only ever sees metadata): "sysu", SYSU-MM01's training size (22,258 RGB
+ 11,909 IR samples of 395 identities, RGB cameras 1/2/4/5, IR 3/6), and "seed004", the guides' set (14,910
samples of 320 identities, 285 of them with IR). Batch 32 = 8 identities x 4 instances. Per repetition:
construction (reading the metadata arrays and building the index), and one epoch (`list(sampler)` after
`set_epoch`). "Before" builds the same epoch (same identities, same P x K) inferring a sample's modality when a
batch needs it, from its path (`cam3/0007/0012.jpg` -> {"ir"}, no file I/O, so it is if anything flattered):
"per-sample" infers the drawn samples (scanning the identity when a draw lacks RGB or IR), "per-identity" rebuilds
each batch identity's RGB and IR lists.
"""

from __future__ import annotations

import logging
import random
import re
import time
from typing import Any

import numpy as np
import torch

from benchmarks.common import RESULTS_DIR, environment, md_table, parser, stats, write_json
from datasets.cached_sampler import CachedModalAwarePKSampler

_CAM_RE = re.compile(r"cam(\d)/")
FLAGS = [("--reps", 30, "repetitions of construction and epoch"),
         ("--before_reps", 3, "repetitions of the slow 'before' epoch"), ("--batch_size", 32, "P x K"),
         ("--num_instances", 4, "K"), ("--out", str(RESULTS_DIR / "sampler_cpu.json"), "JSON path")]  # fmt: skip


class PathMeta:
    """A re-ID set's metadata as arrays (what the cached sampler reads) and as paths (what "before" parses)."""

    def __init__(self, name: str, rgb_per_id: np.ndarray, ir_per_id: np.ndarray, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        pids, cams, mods = [], [], []
        for pid, (nr, ni) in enumerate(zip(rgb_per_id, ir_per_id)):
            pids += [pid] * int(nr + ni)
            cams += rng.choice([1, 2, 4, 5], int(nr)).tolist() + rng.choice([3, 6], int(ni)).tolist()
            mods += ["rgb"] * int(nr) + ["ir"] * int(ni)
        order = rng.permutation(len(pids))  # file lists interleave identities
        self.name, self.calls = name, 0
        self.pids, self.camids, self.modalities = (np.asarray(v)[order] for v in (pids, cams, mods))
        counter: dict[int, int] = {}
        self.img_paths = []
        for p, c in zip(self.pids.tolist(), self.camids.tolist()):
            counter[p] = counter.get(p, 0) + 1
            self.img_paths.append(f"cam{c}/{p:04d}/{counter[p]:04d}.jpg")

    def __len__(self) -> int:
        return len(self.pids)

    def infer_modalities_of_sample(self, i: int) -> set[str]:
        """The seed's per-sample inference: from the file path, every time it is asked."""
        self.calls += 1
        return {"ir"} if int(_CAM_RE.match(self.img_paths[i]).group(1)) in (3, 6) else {"rgb"}  # type: ignore[union-attr]


def split_counts(total: int, n_ids: int, rng: np.random.Generator, low: int) -> np.ndarray:
    """`total` samples over `n_ids` identities, each with at least `low`."""
    return rng.multinomial(total - low * n_ids, rng.dirichlet(np.full(n_ids, 5.0))) + low


def time_sampler(ds: Any, reps: int, **kw: Any) -> tuple[list[float], list[float], CachedModalAwarePKSampler]:
    """Seconds to construct CachedModalAwarePKSampler(ds, **kw) and to draw one epoch (epoch r in repetition r),
    `reps` times; also the last sampler."""
    cons, epoch = [], []
    for r in range(reps):
        t0 = time.perf_counter()
        s = CachedModalAwarePKSampler(ds, **kw)
        cons.append(time.perf_counter() - t0)
        s.set_epoch(r)
        t0 = time.perf_counter()
        assert len(list(s)) == len(s)
        epoch.append(time.perf_counter() - t0)
    return cons, epoch, s


def before_epoch(ds: PathMeta, sampler: CachedModalAwarePKSampler, epoch: int, variant: str) -> list[list[int]]:
    """The same epoch (identity order and P x K) with modalities inferred per batch, the seed guides' way."""
    P, K = sampler.num_ids_per_batch, sampler.num_instances
    pids_of = sampler.eligible_pids[sampler._id_sequence(sampler._rng(epoch))]  # the cached sampler's identities
    by_pid: dict[int, list[int]] = {}  # built once here (generous to the "before")
    for i, p in enumerate(ds.pids.tolist()):
        by_pid.setdefault(p, []).append(i)
    rnd, batches = random.Random(epoch), []
    for b in range(len(pids_of) // P):
        batch: list[int] = []
        for pid in pids_of[b * P : (b + 1) * P].tolist():
            idxs = by_pid[pid]
            if variant == "per-identity":
                rgb = [i for i in idxs if "rgb" in ds.infer_modalities_of_sample(i)]
                ir = [i for i in idxs if "ir" in ds.infer_modalities_of_sample(i)]
                pick = [rnd.choice(rgb)] + ([rnd.choice(ir)] if ir else [])
                rest, k = [i for i in idxs if i not in pick], K - len(pick)
                pick += rnd.sample(rest, k) if len(rest) >= k else rnd.choices(idxs, k=k)
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


def time_before(ds: PathMeta, sampler: CachedModalAwarePKSampler, reps: int, variant: str) -> dict[str, Any]:
    """Seconds and inference calls of `reps` "before" epochs."""
    times, calls = [], []
    for r in range(reps):
        ds.calls, t0 = 0, time.perf_counter()
        assert len(before_epoch(ds, sampler, r, variant)) == sampler.num_batches
        times.append(time.perf_counter() - t0)
        calls.append(ds.calls)
    return {"seconds": times, "stats": stats(times), "infer_calls": calls}


def main(argv: list[str] | None = None) -> int:
    a = parser(__doc__, FLAGS).parse_args(argv)
    logging.getLogger("datasets.cached_sampler").setLevel(logging.WARNING)  # the summary line is timed too
    rng = np.random.default_rng(0)
    sysu = PathMeta("sysu", split_counts(22258, 395, rng, 10), split_counts(11909, 395, rng, 4))
    ir = np.r_[split_counts(4900, 285, rng, 2), np.zeros(35, dtype=np.int64)]  # RGB:IR about 2:1 as in SYSU-MM01
    sets = [sysu, PathMeta("seed004", split_counts(14910 - 4900, 320, rng, 4), ir)]
    results: dict[str, Any] = {"environment": environment(torch.device("cpu")), "config": vars(a), "sets": {}}
    rows = []
    for ds in sets:
        cons, epoch, s = time_sampler(ds, a.reps, batch_size=a.batch_size, num_instances=a.num_instances, seed=42)
        before = {v: time_before(ds, s, a.before_reps, v) for v in ("per-sample", "per-identity")}
        e: dict[str, Any] = {
            "samples": len(ds), "summary": s.summary, "construction_s": cons, "construction": stats(cons),
            "epoch_s": epoch, "epoch": stats(epoch), "before": before,
            "speedup_epoch_vs_before": {v: b["stats"]["median"] / stats(epoch)["median"] for v, b in before.items()},
        }  # fmt: skip
        results["sets"][ds.name], x = e, e["speedup_epoch_vs_before"]
        rows.append([ds.name, len(ds), s.num_ids, s.summary["pairable_ids"], s.num_batches,
                     f"{e['construction']['median'] * 1e3:.2f}", f"{e['epoch']['median'] * 1e3:.2f}",
                     *(f"{b['stats']['median'] * 1e3:.0f} ({b['infer_calls'][0]:,} calls)" for b in before.values()),
                     f"{x['per-sample']:.0f}x / {x['per-identity']:.0f}x"])  # fmt: skip
    path = write_json(a.out, results)
    print(md_table(["set", "samples", "ids", "pairable", "batches/epoch", "construction ms (median)",
                    "epoch ms (median)", "before per-sample ms", "before per-identity ms",
                    "speed-up (per-sample / per-identity)"], rows) + f"\n\nraw: {path}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
