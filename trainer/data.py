"""Data loading: the DataLoader built from the config, the resumable sampler, device-resident batches.

All loader settings are decided here once; invalid combinations are corrected and reported in one line
each, never per step.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from .config import TrainConfig, default_num_workers, usable_cpus
from .knobs import deterministic_worker
from .runtime import Runtime
from .signals import ignore_stop_signals
from .task import Task
from .usercode import UNKNOWN_LENGTH, StreamBatches, auto_workers_for, is_stream


class ShardedBatchSampler:
    """Shuffled batches of indices, sharded across DDP ranks, resumable mid-epoch.

    The order is a function of (seed, epoch) only, so every rank computes the same permutation and keeps
    its own slice, and a resumed run regenerates exactly the batches it had not consumed. A private
    generator is used: the global RNGs are never touched. Small datasets whose epochs follow one another draw
    the next epochs' orders together (the same permutations, `AHEAD_SAMPLES` indices at most): seeding a
    generator costs more than a short epoch's permutation, and a few in a row cost a fraction of one at a time.
    """

    AHEAD_EPOCHS = 32  # at most this many epochs' orders drawn at once
    AHEAD_SAMPLES = 1 << 16  # and at most this many indices held (512 KiB): larger datasets draw one at a time

    def __init__(
        self,
        n: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
    ) -> None:
        if n <= 0:
            raise ValueError("ShardedBatchSampler: the dataset is empty")
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.epoch = 0
        self._start_batch = 0  # one-shot skip for resume
        self._per_rank = per_rank = n // world_size if drop_last or world_size > 1 else n
        self._num_batches = per_rank // batch_size if drop_last else -(-per_rank // batch_size)
        if self._num_batches == 0:
            raise ValueError(
                f"batch_size={batch_size} is larger than the {per_rank} samples each of {world_size} process(es) "
                f"gets, and drop_last=True would leave an empty epoch; lower --batch_size or set drop_last=False"
            )
        self._ahead: dict[tuple[int, int], np.ndarray] = {}  # (seed, epoch): an order drawn ahead, used once
        self._drawn: tuple[int, int] | None = None  # (seed, epoch) of the last order drawn

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self._num_batches

    def _order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        seed, epoch = self.seed, self.epoch
        order = self._ahead.pop((seed, epoch), None)
        if order is None:
            # epochs in sequence: draw the next ones too; any other pattern (a sampler never told its epoch, a
            # resume) draws only the order asked for
            k = 1 if self._drawn != (seed, epoch - 1) else min(self.AHEAD_EPOCHS, max(1, self.AHEAD_SAMPLES // self.n))
            orders = [np.random.default_rng([seed, e]).permutation(self.n) for e in range(epoch, epoch + k)]
            order, self._ahead = orders[0], {(seed, epoch + j): o for j, o in enumerate(orders[1:], 1)}
        self._drawn = (seed, epoch)
        return order

    def __iter__(self) -> Iterator[np.ndarray]:
        order = self._order()
        # equal shares per rank (the tail that does not divide is dropped, as DistributedSampler does)
        mine = order[: self._per_rank * self.world_size][self.rank :: self.world_size]
        start, self._start_batch = self._start_batch, 0
        # int64 arrays, not lists: DataLoader indexes with them as with lists, and device-resident
        # batches wrap them with torch.from_numpy without a per-element conversion
        for b in range(start, self._num_batches):
            yield mine[b * self.batch_size : (b + 1) * self.batch_size]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "seed": self.seed, "batches_done": 0}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self._start_batch = int(state.get("batches_done", 0))


def start_epoch(sampler: Any, epoch: int) -> None:
    """Tell a batch sampler which epoch begins when it takes one (set_epoch); one without yields its own order."""
    set_epoch = getattr(sampler, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


class DeviceBatches:
    """Batches gathered from a dataset already resident on the device: no workers, no copies.

    The dataset provides `gather(idx_tensor) -> batch`; the index tensor is the only transfer per step.
    """

    def __init__(self, dataset: Any, batch_sampler: Any, device: torch.device) -> None:
        self.dataset, self.batch_sampler, self.device = dataset, batch_sampler, device

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[Any]:
        gather, dev = self.dataset.gather, (None if self.device.type == "cpu" else self.device)
        for idx in self.batch_sampler:
            idx = torch.from_numpy(idx) if isinstance(idx, np.ndarray) else torch.as_tensor(idx, dtype=torch.long)
            yield gather(idx if dev is None else idx.to(dev, non_blocking=True))


def to_device(batch: Any, device: torch.device) -> Any:
    """Move a nested batch (tensor, tuple, namedtuple, list, dict) with non_blocking copies."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        moved = [to_device(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)  # a namedtuple: by field
    return batch


def loader_settings(cfg: TrainConfig, device: torch.device, world_size: int = 1) -> tuple[dict[str, Any], list[str]]:
    """DataLoader keyword arguments from the config, with invalid combinations corrected."""
    notes: list[str] = []
    workers = cfg.num_workers
    if workers is None:
        workers = default_num_workers(world_size)
        notes.append(f"num_workers: auto -> {workers}")
    elif workers * world_size > usable_cpus():
        notes.append(
            f"num_workers: {workers} per process x {world_size} process(es) is more than the "
            f"{usable_cpus()} usable CPU cores; workers will compete with the training process"
        )
    pin = cfg.pin_memory and device.type == "cuda"
    if cfg.pin_memory and not pin:
        notes.append("pin_memory: off (no CUDA device; pinning only helps host-to-GPU copies)")
    kw: dict[str, Any] = {"num_workers": workers, "pin_memory": pin}
    if workers > 0:
        # a stop signal is the training process's to handle; deterministic: workers also seed numpy and random
        kw["worker_init_fn"] = deterministic_worker if cfg.deterministic else ignore_stop_signals
        kw["persistent_workers"] = cfg.persistent_workers
        kw["prefetch_factor"] = cfg.prefetch_factor
        ctx = cfg.multiprocessing_context
        if ctx is None and sys.platform == "win32":
            ctx = "spawn"  # the only start method Windows has; stated so the choice is visible
        if ctx is not None:
            kw["multiprocessing_context"] = ctx
    elif cfg.persistent_workers and cfg.num_workers == 0:
        notes.append("persistent_workers: off (needs num_workers > 0)")
    return kw, notes


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the leading size of its first tensor."""
    if isinstance(batch, (tuple, list)):  # noqa: UP038  (a tuple of types is faster than X | Y here)
        batch = batch[0]
    elif isinstance(batch, dict):
        batch = next(iter(batch.values()))
    return batch.shape[0]


def split_batch(batch: Any, k: int) -> list[Any]:
    """A nested batch cut into k micro-batches along the first dimension (for the OOM fallback)."""
    if isinstance(batch, torch.Tensor):
        return list(batch.tensor_split(k))
    if isinstance(batch, dict):
        parts = {key: split_batch(v, k) for key, v in batch.items()}
        return [{key: p[i] for key, p in parts.items()} for i in range(k)]
    if isinstance(batch, list | tuple):
        cols = [split_batch(v, k) for v in batch]
        rows = ([c[i] for c in cols] for i in range(k))
        return [type(batch)(*r) if hasattr(batch, "_fields") else type(batch)(r) for r in rows]
    return [batch] * k


def build_loader(
    dataset: Dataset,
    batch_sampler: Any,
    device: torch.device,
    loader_kw: dict[str, Any],
    collate_fn: Any,
    gatherer: Any,
) -> Any:
    """Device-resident batches when the data is held on the device (`gatherer`), else a DataLoader."""
    if gatherer is not None:
        return DeviceBatches(gatherer, batch_sampler, device)
    return DataLoader(dataset, batch_sampler=IndexLists(batch_sampler), collate_fn=collate_fn, **loader_kw)


class IndexLists:
    """A batch sampler's index arrays as lists of Python ints: what torch's samplers give a dataset's __getitem__
    (a numpy int64 breaks code that wants an int, such as torch.Generator().manual_seed(i))."""

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[Any]:
        return (b.tolist() if isinstance(b, np.ndarray) else b for b in self.batch_sampler)


def close_loader(loader: Any) -> None:
    """End a DataLoader's persistent workers now; they otherwise live in the loader until interpreter exit.

    Its workers ignore stop signals (`ignore_stop_signals`), so the SIGTERM that multiprocessing sends them at
    exit no longer ends them, and its join of them would wait for ever: none may be left for it.
    """
    for name in ("_iterator", "iterator"):  # a DataLoader's persistent workers' iterator; a stream's (StreamBatches)
        it = getattr(loader, name, None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            setattr(loader, name, None)
            it._shutdown_workers()


class TensorGather:
    """A TensorDataset held on the device: a batch is one indexed slice of each tensor, no per-sample work."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], device: torch.device) -> None:
        self.tensors = [t.to(device) for t in tensors]

    def gather(self, idx: torch.Tensor) -> list[torch.Tensor]:  # a list, as DataLoader's collate gives
        return [t[idx] for t in self.tensors]


def _fits(tensors: tuple[torch.Tensor, ...], device: torch.device) -> bool:
    """Auto placement: within 25 % of free GPU memory, or of available RAM on a CPU (1 GiB without psutil)."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    if device.type == "cuda":
        return nbytes <= 0.25 * torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            import psutil

            return nbytes <= 0.25 * psutil.virtual_memory().available
        except ImportError:
            return nbytes <= 2**30
    return False


def _tensors_of(dataset: Any) -> tuple[torch.Tensor, ...] | None:
    """The tensors behind a TensorDataset, or behind a Subset of one (BaseTrainer's splits), else None."""
    if isinstance(dataset, TensorDataset):
        return tuple(dataset.tensors)
    if isinstance(dataset, Subset) and isinstance(dataset.dataset, TensorDataset):
        idx = torch.as_tensor(list(dataset.indices), dtype=torch.long)
        return tuple(t[idx] for t in dataset.dataset.tensors)
    return None


def place_on_device(dataset: Dataset | None, cfg: TrainConfig, device: torch.device) -> Any:
    """Hold the dataset on the device if it can be and fits; returns what serves batches there, or None.

    Two kinds qualify: a torch TensorDataset or a Subset of one (the tensors are copied over; the user's object
    is untouched), and a dataset that speaks the residency protocol, `maybe_to_device(device) -> bool` +
    `gather(index_tensor)`.
    """
    if dataset is None or cfg.device_cache is False:
        return None
    tensors = _tensors_of(dataset)
    if tensors is not None:
        return TensorGather(tensors, device) if cfg.device_cache or _fits(tensors, device) else None
    if not (hasattr(dataset, "gather") and hasattr(dataset, "maybe_to_device")):
        return None
    if cfg.device_cache is not None and hasattr(dataset, "device_cache"):
        dataset.device_cache = cfg.device_cache  # the run's setting wins over the dataset's own (public) knob
    return dataset if dataset.maybe_to_device(device) else None


@dataclass
class TrainData:
    """The training data as the loop reads it, decided once by `build_data`."""

    loader: Any  # a DataLoader, DeviceBatches when the data is held on the device, or StreamBatches
    sampler: Any  # batch sampler (ShardedBatchSampler by default); set_epoch, state_dict: when it has them
    on_device: bool  # batches are gathered on the device: no copy per step
    resident: dict[int, Any]  # id(dataset) -> what serves its batches on the device (train, and val/test if held)
    loader_kw: dict[str, Any]  # the DataLoader settings (empty when the data is on the device)
    notes: list[str]


def build_data(task: Task, cfg: TrainConfig, rt: Runtime) -> TrainData:
    """Data on the device when the dataset speaks the residency protocol and fits, else a DataLoader; a stream
    (IterableDataset) is read in order, one pass an epoch."""
    train, notes = task.train_set, []
    for split, ds in (("train", train), ("val", task.val_set), ("test", task.test_set)):
        if isinstance(ds, Sized) and not is_stream(ds) and len(ds) == 0:  # before the run directory is made
            raise ValueError(f"Task {task.name!r}: its {split} split ({type(ds).__name__}) is empty; give it samples"
                             + ("" if split == "train" else f", or leave it out ({split}_set=None)"))  # fmt: skip
    gatherer = None if is_stream(train) else place_on_device(train, cfg, rt.device)  # a stream has no index
    resident: dict[int, Any] = {}
    loader_kw: dict[str, Any] = {}
    if gatherer is not None:
        resident[id(train)] = gatherer
        for ds in (task.val_set, task.test_set):
            if (g := place_on_device(ds, cfg, rt.device)) is not None:
                resident[id(ds)] = g
        notes.append(f"data: held on {rt.device.type}, batches gathered there (no loader workers)")
        if cfg.num_workers:
            notes.append(
                f"num_workers={cfg.num_workers}, prefetch_factor and persistent_workers are not used: "
                f"the data is held on {rt.device.type}; device_cache off (--device_cache off) brings the loader back"
            )
    else:
        lcfg = cfg
        if cfg.num_workers is None and (note := auto_workers_for(train)[1]):  # auto -> 0 workers, and why
            lcfg = dataclasses.replace(cfg, num_workers=0, persistent_workers=False)
            notes.append(note)
        loader_kw, more = loader_settings(lcfg, rt.device, rt.world_size)
        notes += more
    if is_stream(train):
        try:  # an epoch is one pass; without a len() it ends when the stream is exhausted (as under Lightning)
            n = (len(train) + (0 if cfg.drop_last else cfg.batch_size - 1)) // cfg.batch_size  # type: ignore[arg-type]
        except TypeError:
            n = 0
        n = n or UNKNOWN_LENGTH  # a pass that gives no batch is reported when it comes
        if n == UNKNOWN_LENGTH and cfg.max_steps is None:
            notes.append(f"data: {type(train).__name__} has no len(): an epoch ends when a pass of it is exhausted "
                         f"(an endless stream needs max_steps)")  # fmt: skip
        stream = StreamBatches(train, cfg.batch_size, n, loader_kw, task.collate_fn, cfg.drop_last, cfg.seed + rt.rank)
        if loader_kw["num_workers"]:
            notes.append(
                f"data: {type(train).__name__} is a stream read by {loader_kw['num_workers']} worker(s): "
                f"each worker runs the whole stream unless it splits itself with torch.utils.data.get_worker_info()"
            )
        return TrainData(stream, stream, False, {}, loader_kw, notes)
    sampler: Any
    if task.batch_sampler_fn is not None:
        sampler = task.batch_sampler_fn(train, cfg.batch_size, cfg.seed, rt.rank, rt.world_size, cfg.drop_last)
    else:
        sampler = ShardedBatchSampler(
            len(train),  # type: ignore[arg-type]  # a map-style dataset has a length
            cfg.batch_size,
            shuffle=cfg.shuffle,
            seed=cfg.seed,
            rank=rt.rank,
            world_size=rt.world_size,
            drop_last=cfg.drop_last,
        )
    if not (hasattr(sampler, "state_dict") and hasattr(sampler, "load_state_dict")):
        notes.append(
            f"sampler: {type(sampler).__name__} has no state_dict/load_state_dict, so a resume mid-epoch replays its "
            f"epoch from set_epoch and skips the batches already trained (exact only if its order depends on the "
            f"epoch alone)"
        )
    # a private generator: starting the loader draws nothing from the global RNG (exact resume)
    kw = dict(loader_kw, generator=torch.Generator().manual_seed(cfg.seed + rt.rank))
    loader = build_loader(train, sampler, rt.device, kw, task.collate_fn, gatherer)
    return TrainData(loader, sampler, gatherer is not None, resident, loader_kw, notes)
