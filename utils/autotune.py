"""Measure instead of guessing: the largest batch size that fits and the fastest `num_workers`.

Ground floor: nothing here imports the trainer. The trainer hands in callables:
- `find_max_batch_size(try_batch)`: `try_batch(bs)` runs one forward+backward at batch size `bs` and
  raises an out-of-memory error when it does not fit.
- `tune_num_workers(make_loader)`: `make_loader(n)` returns a fresh DataLoader with `num_workers=n`.

Seed 003's learning-rate rule of thumb (`new_lr = old_lr * sqrt(new_bs / old_bs)`) is `scale_lr(..., "sqrt")`;
"linear" is Goyal et al.'s rule for SGD; the right one is the one your validation loss agrees with.
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["find_max_batch_size", "scale_lr", "tune_num_workers", "is_oom_error"]

_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate")


def is_oom_error(err: BaseException) -> bool:
    """True for torch.OutOfMemoryError and RuntimeErrors that report an allocation failure (CUDA, CPU, MPS)."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(err, oom_type):
        return True
    return isinstance(err, (RuntimeError, MemoryError)) and (
        isinstance(err, MemoryError) or any(m in str(err).lower() for m in _OOM_MARKERS)
    )


def _release_memory() -> None:
    # The failed attempt's tensors are referenced by the traceback until it is dropped; collect them,
    # then hand cached blocks back so the next (smaller) try starts from a clean allocator.
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def find_max_batch_size(
    try_batch: Callable[[int], None],
    start: int = 2,
    max_batch: int = 4096,
    target: int | None = None,
) -> dict[str, Any]:
    """Largest batch size for which `try_batch(bs)` succeeds: doubling from `start`, then binary search.

    With `target` (the effective batch you want), the search stops at `target` and the result says how
    many gradient-accumulation steps keep the effective batch: ceil(target / batch_size). Because
    batch_size * accumulate may overshoot target, `balanced_batch_size` = ceil(target / accumulate) is
    also returned: the smallest micro-batch with the same accumulation (effective batch closest to target).

    Returns {"batch_size", "accumulate_grad_batches", "effective_batch_size", "balanced_batch_size",
    "hit_max": bool, "tried": [(bs, ok), ...]}. Errors other than out-of-memory propagate.
    """
    if start < 1 or max_batch < 1:
        raise ValueError(f"find_max_batch_size(start={start}, max_batch={max_batch}): both must be >= 1")
    if target is not None and target < 1:
        raise ValueError(f"find_max_batch_size(target={target}): the effective batch must be >= 1 or None")
    upper = min(max_batch, target) if target is not None else max_batch
    start = min(start, upper)
    tried: list[tuple[int, bool]] = []
    cache: dict[int, bool] = {}

    def fits(bs: int) -> bool:
        if bs in cache:
            return cache[bs]
        try:
            try_batch(bs)
            ok = True
        except Exception as err:
            if not is_oom_error(err):
                raise
            ok = False
        if not ok:
            _release_memory()  # outside the except block so the traceback (and its tensors) is gone
        cache[bs] = ok
        tried.append((bs, ok))
        return ok

    # Phase 1: find a size that fits (halve on failure) and one that does not (double on success).
    good, bad = 0, None
    bs = start
    if not fits(bs):
        bad = bs
        while bs > 1:
            bs //= 2
            if fits(bs):
                good = bs
                break
            bad = bs
        if good == 0:
            raise RuntimeError(
                f"find_max_batch_size: even batch size {bs} runs out of memory; the model itself does not fit. "
                "Use bf16, activation checkpointing or a smaller model."
            )
    else:
        good = bs
        while good < upper:
            nxt = min(good * 2, upper)
            if fits(nxt):
                good = nxt
            else:
                bad = nxt
                break
    # Phase 2: binary search in (good, bad).
    if bad is not None:
        lo, hi = good, bad
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        good = lo
    accum = math.ceil(target / good) if target is not None else 1
    balanced = math.ceil(target / accum) if target is not None else good
    return {
        "batch_size": good,
        "accumulate_grad_batches": accum,
        "balanced_batch_size": balanced,
        "effective_batch_size": good * accum,
        "hit_max": bad is None,
        "tried": tried,
    }


def scale_lr(lr: float, new_bs: int, ref_bs: int, rule: str) -> float:
    """Rescale a learning rate tuned at `ref_bs` for `new_bs`: "sqrt" (seed 003, Adam-family), "linear" (SGD), "none"."""
    if new_bs < 1 or ref_bs < 1:
        raise ValueError(f"scale_lr(new_bs={new_bs}, ref_bs={ref_bs}): batch sizes must be >= 1")
    if lr <= 0:
        raise ValueError(f"scale_lr(lr={lr}): the learning rate must be > 0")
    ratio = new_bs / ref_bs
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    if rule == "linear":
        return lr * ratio
    if rule == "none":
        return lr
    raise ValueError(f"scale_lr(rule={rule!r}): choose 'sqrt', 'linear' or 'none' (--lr_scaling)")


def _batch_len(batch: Any) -> int:
    # Samples in a (possibly nested) batch: the leading dimension of its first tensor.
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, dict):
        for v in batch.values():
            return _batch_len(v)
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_len(batch[0])
    return 1


def default_worker_candidates(cpus: int | None = None) -> list[int]:
    """0, 1, 2, 4, ... up to the CPUs this process may use."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # macOS, Windows
            cpus = os.cpu_count() or 1
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
        it = iter(loader)
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration as e:
            raise ValueError(f"tune_num_workers: the loader for num_workers={n} yielded no batch") from e
        t1 = time.perf_counter()
        startup[n] = t1 - t0
        samples, got = 0, 0
        for batch in it:
            samples += _batch_len(batch)
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
