"""The largest batch that fits: a search over batch sizes, and the probe that runs it on a task.

    cfg, note = auto_batch_size(cfg, task)      # BaseTrainer(trainer_params={"auto_batch_size": True}), --auto_batch_size

`find_max_batch_size(try_batch)` is the search alone: `try_batch(bs)` runs one forward+backward at batch
size `bs` and raises an out-of-memory error when it does not fit; it doubles from `start`, then bisects.
`auto_batch_size` builds that `try_batch` from a Trainer on a copy of the task's model (the real model is
never trained by the probe) and returns the config to train with.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import math
from collections.abc import Callable, Sized
from typing import TypedDict

import torch
from torch.utils.data import default_collate

from ..config import TrainConfig
from ..data import to_device
from ..loop import Trainer
from ..task import Task

__all__ = ["auto_batch_size", "clone_task_model", "find_max_batch_size", "is_oom_error"]


def clone_task_model(task: Task) -> Task:
    """A copy of the task with its own model, so a trial run does not train the real one."""
    return dataclasses.replace(task, model=copy.deepcopy(task.model))


class BatchSearch(TypedDict):
    """find_max_batch_size's result."""

    batch_size: int
    accumulate_grad_batches: int
    balanced_batch_size: int
    effective_batch_size: int
    hit_max: bool
    tried: list[tuple[int, bool]]


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
    # then hand cached blocks back so the next (smaller) try starts from a clean allocator. Only CUDA caches
    # freed blocks; on a CPU reference counting has already freed them (and a full collection costs ~1 s in
    # a large process).
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


def find_max_batch_size(
    try_batch: Callable[[int], None],
    start: int = 2,
    max_batch: int = 4096,
    target: int | None = None,
) -> BatchSearch:
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

    good, bad = _largest_fitting(fits, start, upper)
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


def _largest_fitting(fits: Callable[[int], bool], start: int, upper: int) -> tuple[int, int | None]:
    """(the largest size that fits, the smallest tried that did not, None if `upper` fit): doubling or halving from
    `start`, then a binary search between the two."""
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
    return good, bad


def search_cap(n_samples: int, device_type: str) -> int:
    """Where the search stops: memory is the limit on a GPU (up to 4096, and at most half the data so an epoch
    has 2 batches); on a CPU nothing runs out before the machine does, so it stops where 8 batches remain."""
    if device_type == "cuda":
        return max(1, min(4096, n_samples // 2))
    return max(1, n_samples // 8)


def auto_batch_size(cfg: TrainConfig, task: Task) -> tuple[TrainConfig, str]:
    """Search the largest batch that fits for `task` under `cfg`; returns (the config to train with, a note).

    Without accumulation the batch grows and the learning rate follows by `cfg.lr_scaling` from the batch
    given (ref_batch_size). With `accumulate_grad_batches > 1` the effective batch is kept and split into as
    few micro-batches as fit (the usual "smaller batch + accumulation" remedy, found automatically).
    """
    made = Trainer(
        dataclasses.replace(cfg, max_steps=1, progress_bar=False, resume=None),
        clone_task_model(task),
        log=lambda _s: None,
    )
    ds, dev = task.train_set, made.rt.device
    if not isinstance(ds, Sized):  # the search draws samples by index
        raise TypeError(f"auto_batch_size: the training set ({type(ds).__name__}) has no len()")
    probe: Trainer | None = made  # set to None after the search, so its memory can go
    del made
    collate = task.collate_fn or default_collate
    gen = torch.Generator().manual_seed(cfg.seed)  # private: the probe never moves the global RNG

    def try_batch(bs: int) -> None:
        idx = torch.randint(0, len(ds), (bs,), generator=gen)
        assert probe is not None  # released only after the search
        gatherer = probe.data.resident.get(id(ds))  # the data held on the device: batches are gathered there
        batch = (
            gatherer.gather(idx.to(dev))
            if gatherer is not None
            else to_device(collate([ds[i] for i in idx.tolist()]), dev)
        )
        # the step without the loop's out-of-memory fallback (which would split the batch and always "fit")
        probe.forward_backward(batch, 1, split_on_oom=False)
        for p in probe.opt.params:
            p.grad = None

    cap = search_cap(len(ds), dev.type)
    target = cfg.batch_size * cfg.accumulate_grad_batches
    keep_effective = cfg.accumulate_grad_batches > 1
    try:
        res = find_max_batch_size(try_batch, start=2, max_batch=cap, target=target if keep_effective else None)
    finally:
        probe = None  # the probe's model copy and optimizer state go before the real run allocates its own
        _release_memory()
    best = res["batch_size"]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        t = torch.tensor(best, device=dev)  # every rank must train with the same batch: the smallest that fits
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        best = int(t.item())
        if keep_effective:
            res["accumulate_grad_batches"] = math.ceil(target / best)
            res["balanced_batch_size"] = math.ceil(target / res["accumulate_grad_batches"])
    tried = ", ".join(f"{b}{'' if ok else ' (out of memory)'}" for b, ok in res["tried"])
    if keep_effective:
        accum, bs = res["accumulate_grad_batches"], res["balanced_batch_size"]
        new = dataclasses.replace(cfg, batch_size=bs, accumulate_grad_batches=accum)
        note = (
            f"auto_batch_size: largest that fits {best}; using {bs} x {accum} accumulation to keep the "
            f"effective batch {target} (tried {tried})"
        )
    else:
        new = dataclasses.replace(cfg, batch_size=best, ref_batch_size=cfg.ref_batch_size or cfg.batch_size)
        note = (
            f"auto_batch_size: {cfg.batch_size} -> {best}{' (search cap: ' + str(cap) + ')' if res['hit_max'] else ''}; "
            f"lr follows by {new.lr_scaling} scaling from batch {new.ref_batch_size} (tried {tried})"
        )
    return new, note
