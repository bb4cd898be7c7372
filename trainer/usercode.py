"""Users' own code as it is: streams (IterableDataset), cheap in-memory datasets, and resume lines that fit a repo
where plainloop is only the copied `trainer/` folder (the command line plugs in its own)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sized
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from . import layers

Collate = Callable[[list[Any]], object]  # a DataLoader's collate_fn: a list of samples -> a batch


def cli_resume_line(target: str | os.PathLike[str], prefix: str = "python") -> str | None:
    """The command line's own resume line while it runs (trainer/layers.py), else None (the Python door)."""
    return next((line for command in layers.RESUME_COMMANDS if (line := command(target, prefix))), None)


def resume_hint(target: str | os.PathLike[str], prefix: str = "python") -> str:
    """How to continue a run: the command line's own line while it runs, else the Python call."""
    if line := cli_resume_line(target, prefix):
        return line
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] not in ("", "-c") else ""
    # a plain script of the user's names itself; `python -m pkg` and tools (pytest) run a __main__.py
    again = f", then run {prefix} {script} again" if script.endswith(".py") and script != "__main__.py" else ""
    return f"TrainConfig(..., resume={str(target)!r}) (BaseTrainer: checkpoint_path={str(target)!r}){again}"


def own_settings_hint(target: str | os.PathLike[str]) -> str:
    """How a resume gets the run's own settings back (`target`: a run or its checkpoint): the command line restores
    them, Python reads the run's config.toml."""
    if cli_resume_line(target):
        return "--resume RUN_DIR alone restores them"
    run = Path(target).parent.parent if Path(target).suffix == ".pt" else Path(target)  # RUN/checkpoints/last.pt
    return f"TrainConfig(**tomllib.load(f)['train'], resume=...) with f the open {run / 'config.toml'}"


def rerun_hint(config_toml: str | os.PathLike[str]) -> str:
    """The header line of a run's config.toml."""
    for command in layers.RERUN_COMMANDS:
        if line := command(config_toml):
            return f"Resolved configuration of this run: re-run it with\n{line}"
    return (
        "Resolved configuration of this run: the TrainConfig fields it ran with, in [train]; with open(this file, "
        "'rb') as f: TrainConfig(**tomllib.load(f)['train']) rebuilds it"
    )


# ------------------------------------------------------------------ IterableDataset
def is_stream(dataset: object) -> TypeGuard[IterableDataset]:
    return isinstance(dataset, IterableDataset)


UNKNOWN_LENGTH = 2**62  # batches per epoch of a stream without a len(): its pass ends when it is exhausted


class StreamBatches:
    """An IterableDataset served as plainloop's loader and sampler at once: an epoch is one pass, at most
    `num_batches` (UNKNOWN_LENGTH: until the stream is exhausted; the next epoch iterates it again). Resume: a
    dataset with `state_dict()`/`load_state_dict()` is restored (it must then continue where it stopped); any other
    stream is replayed from its pass's start and the batches already trained are skipped (exact when deterministic).
    """

    def __init__(self, dataset: IterableDataset, batch_size: int, num_batches: int, loader_kw: dict[str, Any],
                 collate_fn: Collate | None, drop_last: bool, seed: int) -> None:  # fmt: skip
        self.dataset, self.num_batches = dataset, num_batches
        # a private generator: starting the loader must not draw from the global RNG (dropout after a resume)
        self.loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, drop_last=drop_last,
                                 generator=torch.Generator().manual_seed(seed), **loader_kw)  # fmt: skip
        self.epoch, self._skip = 0, 0
        # a stream with its own state continues from its state at a save (read in this process), not its epoch's start
        self.resumes_from_now = hasattr(dataset, "state_dict") and hasattr(dataset, "load_state_dict")
        self.iterator: Iterator[object] | None = None

    def __len__(self) -> int:
        return self.num_batches

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[object]:
        skip, self._skip = self._skip, 0
        # kept where close_loader looks: the run stops mid-stream, and its workers must end with the fit
        it = self.iterator = iter(self.loader)
        for _ in range(skip):  # replay: the batches trained before the stop
            if next(it, it) is it:  # the pass ended sooner this time
                return
        yield from it

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epoch": self.epoch, "batches_done": 0}
        if self.resumes_from_now:
            out["dataset"] = getattr(self.dataset, "state_dict")()  # noqa: B009 (duck-typed)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state.get("epoch", 0))
        if self.resumes_from_now and "dataset" in state:
            getattr(self.dataset, "load_state_dict")(state["dataset"])  # noqa: B009 (duck-typed)
        else:
            self._skip = int(state.get("batches_done", 0))


# ------------------------------------------------------------------ in-memory datasets
def in_memory_cost(dataset: Dataset, probes: int = 64, budget_s: float = 0.05) -> float | None:
    """Seconds per sample to index `dataset` in this process, measured on up to `probes` spread-out samples.

    None when it cannot be measured cheaply (no length, an error, or slower than the budget: that data is read
    from files and wants worker processes).
    """
    if not isinstance(dataset, Sized):
        return None
    try:
        n = len(dataset)
    except TypeError:  # a __len__ that says it has none
        return None
    if n == 0:
        return None
    idx = [int(i * n / probes) for i in range(min(probes, n))]
    t0 = time.perf_counter()
    try:
        for i in idx:
            dataset[i]
            if time.perf_counter() - t0 > budget_s:
                return None
    except Exception:  # noqa: BLE001 (a lazily opened dataset may only work in workers: keep them)
        return None
    return (time.perf_counter() - t0) / len(idx)


# Indexing cheaper than this per sample (measured: benchmarks/user_loop.py) is faster in the main process than
# handing batches over from a worker process (pickling, a queue, a pin thread).
CHEAP_S_PER_SAMPLE = 2e-5


def holds_arrays(dataset: object) -> bool:
    """The dataset (or the one a Subset cuts) keeps its data as tensors or arrays in memory (not memory-mapped
    files): indexing it in the main process opens no file a forked worker would inherit."""
    base = getattr(dataset, "dataset", dataset) if hasattr(dataset, "indices") else dataset
    values = list(vars(base).values()) if hasattr(base, "__dict__") else []
    values += [x for v in values if isinstance(v, list | tuple) for x in v]
    return any(
        isinstance(v, torch.Tensor) or (isinstance(v, np.ndarray) and not isinstance(v, np.memmap)) for v in values
    )


def auto_workers_for(dataset: Dataset) -> tuple[int | None, str | None]:
    """0 workers, and why, for a stream or a dataset held in memory (its tensors/arrays) that indexes cheaply
    (measured once at start-up); else None (no view: the usual worker count)."""
    if is_stream(dataset):
        return 0, "num_workers: auto -> 0 for a stream (IterableDataset); give num_workers to read it in workers"
    if os.environ.get("PLAINLOOP_NO_WORKER_PROBE") or not holds_arrays(dataset):
        return None, None
    cost = in_memory_cost(dataset)
    if cost is None or cost > CHEAP_S_PER_SAMPLE:
        return None, None
    return 0, (
        f"num_workers: auto -> 0: {type(dataset).__name__} indexes in memory in {cost * 1e6:.1f} us per sample "
        f"(measured), cheaper than a worker process hands a batch over"
    )
