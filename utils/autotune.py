"""Measure instead of guessing: the fastest `num_workers`, and the learning rate for a new batch size.

Ground floor: nothing here imports the trainer. The trainer hands in callables:
- `tune_num_workers(make_loader)`: `make_loader(n)` returns a fresh DataLoader with `num_workers=n`.
The largest batch size that fits is searched by the engine itself: `trainer/extras/autobatch.py`
(`find_max_batch_size`, `auto_batch_size`), so a copied `trainer/` folder has it too.

The square-root learning-rate rule of thumb (`new_lr = old_lr * sqrt(new_bs / old_bs)`) is the engine's
`trainer.optim.scaled_lr(..., "sqrt")` (`--ref_batch_size`, `--lr_scaling`); "linear" is Goyal et al.'s rule for
SGD; the right one is the one your validation loss agrees with.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from typing import Any

from utils.performance_monitor import usable_cpus

__all__ = ["tune_num_workers", "default_worker_candidates"]


def default_worker_candidates(cpus: int | None = None) -> list[int]:
    """0, 1, 2, 4, ... up to the CPUs this process may use."""
    if cpus is None:
        cpus = usable_cpus()
    out = [0]
    n = 1
    while n <= cpus:
        out.append(n)
        n *= 2
    if out[-1] != cpus:
        out.append(cpus)
    return out


def tune_num_workers(
    make_loader: Callable[[int], Iterable],
    candidates: list[int] | None = None,
    batches: int = 20,
) -> dict[str, Any]:
    """Time `batches` batches from `make_loader(n)` for each candidate n; pick the highest samples/s.

    The loader must have a `batch_size` (a DataLoader built with one): samples/s = batches/s x batch_size.
    The first batch of each loader is excluded (worker start-up); its time is reported as startup_s.
    Returns {"num_workers", "samples_per_s": {n: rate}, "startup_s": {n: s}, "batches": batches}.
    """
    if batches < 1:
        raise ValueError(f"tune_num_workers(batches={batches}): need at least 1 timed batch")
    cands = default_worker_candidates() if candidates is None else list(dict.fromkeys(candidates))
    if not cands or any(n < 0 for n in cands):
        raise ValueError(f"tune_num_workers(candidates={candidates}): give non-negative worker counts")
    rates: dict[int, float] = {}
    startup: dict[int, float] = {}
    for n in cands:
        loader = make_loader(n)
        per_batch = getattr(loader, "batch_size", None)
        if not isinstance(per_batch, int) or per_batch < 1:
            raise ValueError(
                f"tune_num_workers: the loader for num_workers={n} has no batch_size ({per_batch!r}); "
                "build it as DataLoader(dataset, batch_size=..., num_workers=n)"
            )
        it = iter(loader)
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration as e:
            raise ValueError(f"tune_num_workers: the loader for num_workers={n} yielded no batch") from e
        t1 = time.perf_counter()
        startup[n] = t1 - t0
        samples, got = 0, 0
        for _ in it:
            samples += per_batch
            got += 1
            if got >= batches:
                break
        dt = time.perf_counter() - t1
        if got == 0:
            raise ValueError(
                f"tune_num_workers: the loader for num_workers={n} has a single batch; "
                "give it more data or a smaller batch size"
            )
        rates[n] = samples / dt if dt > 0 else float("inf")
        del it, loader  # shut the workers down before starting the next pool
        gc.collect()
    best = max(rates, key=lambda k: rates[k])
    return {"num_workers": best, "samples_per_s": rates, "startup_s": startup, "batches": batches}
