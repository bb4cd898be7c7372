"""P x K identity batch sampler for (cross-modality) re-identification, with metadata cached once.

Seed guide 004 found its re-ID trainer spent most of its time in the sampler: the modality of every sample
of every batch was inferred again (`infer_modalities_of_sample()`, 59,616 calls an epoch). This sampler
reads identity, camera and modality once at construction, vectorised, and draws every batch of an epoch
with a handful of numpy operations.

    sampler = CachedModalAwarePKSampler(train_set, batch_size=32, num_instances=4, epoch_length="seed")
    print(sampler.describe())                # the cache summary (also as data: sampler.cache_summary)
    loader = sampler.loader(train_set, num_workers=2, pin_memory=True, drop_last=True)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader: ...

`sampler.loader(dataset, **DataLoader_kwargs)` is `DataLoader(dataset, batch_sampler=sampler, ...)`. PyTorch
refuses `DataLoader(batch_sampler=..., drop_last=True)` (a common re-ID loader does exactly that) with
"batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last": a batch
sampler decides the batches, so `drop_last` belongs to the sampler (`CachedModalAwarePKSampler(...,
drop_last=True)`). `loader()` accepts `drop_last` when it agrees with the sampler's and otherwise says
which setting to change instead; `batch_size`, `shuffle` and `sampler` get the same explanation.

Definitions (what the invariants in tests/test_cached_sampler.py check):
- P = batch_size // num_instances distinct identities per batch, K = num_instances samples each.
- A sample "carries" a modality: "rgb" (aliases: visible, vis, color, colour) or any other name ("ir",
  "nir", "thermal", ...). A sample may carry several (a set/tuple of names). A sample is "complete" when it
  carries every modality present in the dataset.
- Eligible identity: pid >= 0 (negative pids are junk/distractors and never sampled) and, with
  ensure_rgb=True, at least one RGB-carrying sample. Identities with only non-RGB samples are then
  excluded and counted in the log. "Pairable" identities carry both RGB and non-RGB samples.
- Per identity and batch, with ensure_rgb: slot 1 is an RGB-carrying sample (a complete one when
  prefer_complete and the identity has any); when that sample carries no non-RGB modality and the identity
  has non-RGB samples (and K >= 2), slot 2 is a non-RGB sample. Without ensure_rgb, prefer_complete still
  puts a complete sample first when the identity has one. The remaining slots are uniform draws without
  replacement from the identity's other samples; only an identity with fewer than K samples gets repeats.
- An epoch is `num_passes` passes over the eligible identities in a fresh random order: each pass every
  identity appears once, and a step never holds the same identity twice (also not across ranks, also
  where a pass boundary falls inside a step). num_passes=None picks round(eligible samples / (ids * K)),
  so an epoch shows about as many samples as the dataset holds; num_passes=1 is the seed's
  "batches = ids / P" epoch.
- `epoch_length` sets the epoch instead: "auto" (= num_passes as above), "seed" (one pass: eligible
  ids // (P * world_size) batches per rank, the usual re-ID epoch; a real run's log showed 35 batches for 285 pairable of
  320 ids at P = 8, i.e. it counted pairable ids, which equals eligible ids when every identity has both
  modalities, as in SYSU-MM01 and the synthetic set), or an integer n: exactly n batches per rank per
  epoch, drawn from as many passes as needed (the last one cut short).
- drop_last=True drops the last incomplete step; drop_last=False pads it with identities not already in
  it. Either way every batch is exactly P x K and `len(sampler)` is what the next `__iter__` yields.
- Randomness comes from a private numpy Generator seeded with (seed, epoch): the same seed and epoch give
  the same batches on every rank and in every run; global random / numpy / torch RNG states are untouched.

Only numpy is imported at module level; torch only where it is used (torch.distributed to read rank /
world size when a process group exists, torch.utils.data in `loader()`), so the file copies alone.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

RGB_ALIASES = frozenset({"rgb", "visible", "vis", "color", "colour"})
_RGB_BIT = 1


# ----------------------------------------------------------------------------------------------- metadata
def _modality_bit(name: Any, bits: dict[str, int], where: str) -> int:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"{where}: modality {name!r} is not a non-empty string; use names such as 'rgb' or 'ir' "
            f"(or a set/tuple of such names for a multi-modal sample)"
        )
    key = name.strip().lower()
    if key in RGB_ALIASES:
        return _RGB_BIT
    if key not in bits:
        bits[key] = 1 << (len(bits) + 1)  # bit 0 is rgb
        if len(bits) > 30:
            raise ValueError(f"{where}: more than 30 distinct modality names ({sorted(bits)[:8]}...)")
    return bits[key]


def encode_modalities(
    modalities: Sequence[Any] | np.ndarray, where: str = "dataset.modalities"
) -> tuple[np.ndarray, list[str]]:
    """Modalities per sample -> (int64 bit masks, names of the bits). Bit 0 is always "rgb".

    A numpy string array (the fast path, used by datasets/reid.py) costs one vectorised comparison per
    distinct value; a Python list of strings is converted once; anything else (sets, tuples) is read with
    one memoised pass.
    """
    bits: dict[str, int] = {}
    arr: np.ndarray | None = None
    if isinstance(modalities, np.ndarray) and modalities.dtype.kind in "US" and modalities.ndim == 1:
        arr = modalities
    elif not isinstance(modalities, np.ndarray) and len(modalities) and isinstance(modalities[0], str):
        try:
            cand = np.asarray(modalities)
        except ValueError:  # mixed strings and sets/tuples: the memoised pass below
            cand = None
        if cand is not None and cand.dtype.kind == "U" and cand.ndim == 1:
            arr = cand
    if arr is not None:
        masks = np.zeros(len(arr), dtype=np.int64)
        done = np.zeros(len(arr), dtype=bool)
        while not done.all():
            first = int(np.argmax(~done))
            sel = arr == arr[first]
            masks[sel] = _modality_bit(str(arr[first]), bits, where)
            done |= sel
    else:
        memo: dict[Any, int] = {}
        masks = np.empty(len(modalities), dtype=np.int64)
        for i, m in enumerate(modalities):
            key = frozenset(m) if isinstance(m, set | frozenset | list) else m
            code = memo.get(key)
            if code is None:
                names = (m,) if isinstance(m, str) else tuple(m)
                if not names:
                    raise ValueError(f"{where}[{i}]: empty modality set; every sample needs at least one modality")
                code = 0
                for name in names:
                    code |= _modality_bit(name, bits, f"{where}[{i}]")
                memo[key] = code
            masks[i] = code
    names_out = ["rgb"] + [n for n, _ in sorted(bits.items(), key=lambda kv: kv[1])]
    return masks, names_out


def read_metadata(dataset: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(pids, camids, modality masks, modality names) for every sample of `dataset`.

    Preferred: the dataset exposes sequences `pids`, `camids` (optional) and `modalities`. Otherwise one
    pass over `dataset.get_meta(i) -> (pid, camid, modality)`, or seed-style
    `dataset.infer_modalities_of_sample(i)` together with `dataset.pids`.
    """
    name = type(dataset).__name__
    n = len(dataset)
    if n == 0:
        raise ValueError(f"CachedModalAwarePKSampler: {name} is empty; there is nothing to sample")
    if hasattr(dataset, "pids") and hasattr(dataset, "modalities"):
        pids, camids, mods = dataset.pids, getattr(dataset, "camids", None), dataset.modalities
    elif hasattr(dataset, "get_meta"):
        metas = [dataset.get_meta(i) for i in range(n)]  # the one per-sample pass
        pids = [m[0] for m in metas]
        camids = [m[1] for m in metas]
        mods = [m[2] for m in metas]
    elif hasattr(dataset, "pids") and hasattr(dataset, "infer_modalities_of_sample"):
        pids, camids = dataset.pids, getattr(dataset, "camids", None)
        mods = [dataset.infer_modalities_of_sample(i) for i in range(n)]  # the one per-sample pass
    else:
        raise TypeError(
            f"CachedModalAwarePKSampler: {name} exposes no metadata; give it sequences `pids` (int), "
            f"`camids` (int) and `modalities` ('rgb'/'ir' or a set of them per sample), or a method "
            f"`get_meta(index) -> (pid, camid, modality)`"
        )
    pids_a = np.asarray(pids, dtype=np.int64).reshape(-1)
    cam_a = np.zeros(n, dtype=np.int64) if camids is None else np.asarray(camids, dtype=np.int64).reshape(-1)
    for attr, a in (("pids", pids_a), ("camids", cam_a)):
        if len(a) != n:
            raise ValueError(f"{name}.{attr} has {len(a)} entries but the dataset has {n} samples")
    if len(mods) != n:
        raise ValueError(f"{name}.modalities has {len(mods)} entries but the dataset has {n} samples")
    masks, mod_names = encode_modalities(mods, where=f"{name}.modalities")
    return pids_a, cam_a, masks, mod_names


def parse_epoch_length(value: Any) -> int | str | None:
    """ "auto" -> None, "seed" -> "seed", a positive integer (or its string) -> int; anything else raises."""
    if isinstance(value, str) and value.strip().lower() in ("auto", "seed"):
        v = value.strip().lower()
        return None if v == "auto" else v
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if isinstance(value, bool) or n < 1 or (not isinstance(value, str) and n != value):
        raise ValueError(
            f"epoch_length={value!r}: use 'auto' (about one look per sample), 'seed' (one pass over the "
            f"identities: ids / P batches per epoch) or a positive number of batches per epoch"
        )
    return n


def _batch_sampler_rule(given: str, fix: str, sampler: Any) -> str:
    return (
        f"DataLoader {given} cannot be combined with batch_sampler=CachedModalAwarePKSampler: PyTorch raises "
        f"'batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last', "
        f"because a batch sampler decides every batch itself. Set {fix} on the sampler instead (this one has "
        f"batch_size={sampler.batch_size}, drop_last={sampler.drop_last}) and leave it out of the DataLoader."
    )


def _dist_rank_world() -> tuple[int, int]:
    # a process group can only exist if torch is already imported: do not pay torch's import for nothing
    if "torch" not in sys.modules:
        return 0, 1
    try:
        import torch.distributed as dist
    except ImportError:  # a torch build without distributed support
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()  # local queries, no collective
    return 0, 1


# ------------------------------------------------------------------------------------------------ sampler
class CachedModalAwarePKSampler:
    """P identities x K instances per batch, modality-aware, cached metadata, DDP-sharded, resumable.

    Use as `DataLoader(dataset, batch_sampler=sampler)`. See the module docstring for the exact rules.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        num_instances: int,
        ensure_rgb: bool = True,
        prefer_complete: bool = True,
        seed: int = 42,
        drop_last: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        num_passes: int | None = None,
        epoch_length: int | str = "auto",
    ) -> None:
        t0 = time.perf_counter()
        if not isinstance(num_instances, int | np.integer) or num_instances < 1:
            raise ValueError(f"num_instances={num_instances!r}: K must be an integer >= 1 (samples per identity)")
        if not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: must be an integer >= 1")
        if batch_size % num_instances:
            lo = batch_size - batch_size % num_instances
            raise ValueError(
                f"batch_size={batch_size} is not divisible by num_instances={num_instances}; a P x K batch "
                f"needs batch_size = P * K, e.g. batch_size={lo or num_instances} or {lo + num_instances}"
            )
        if not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError(f"seed={seed!r}: must be a non-negative integer")
        if num_passes is not None and (not isinstance(num_passes, int | np.integer) or num_passes < 1):
            raise ValueError(f"num_passes={num_passes!r}: must be None (auto) or an integer >= 1")
        fixed_len = parse_epoch_length(epoch_length)
        if fixed_len is not None and num_passes is not None:
            raise ValueError(
                f"epoch_length={epoch_length!r} and num_passes={num_passes} both set the epoch; give one of them"
            )
        if (rank is None) != (world_size is None):
            raise ValueError(f"rank={rank} and world_size={world_size}: give both or neither")
        if rank is None:
            rank, world_size = _dist_rank_world()
        assert world_size is not None
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank}, world_size={world_size}: need world_size >= 1 and 0 <= rank < world_size")

        self.batch_size, self.num_instances = int(batch_size), int(num_instances)
        self.num_ids_per_batch = self.batch_size // self.num_instances  # P
        self.ensure_rgb, self.prefer_complete = bool(ensure_rgb), bool(prefer_complete)
        self.seed, self.drop_last = int(seed), bool(drop_last)
        self.rank, self.world_size = int(rank), int(world_size)
        self.epoch = 0
        self._resume_epoch: int | None = None  # one-shot skip after load_state_dict
        self._resume_from = 0
        self._batches_done = 0

        pids, camids, masks, self.modality_names = read_metadata(dataset)
        self.num_samples = len(pids)
        self._build_index(pids, masks)
        self.camids = camids  # kept for users (e.g. camera-aware variants); the sampler does not need it

        n_ids, pw = self.num_eligible_ids, self.num_ids_per_batch * self.world_size
        if n_ids < pw:
            why = " with at least one RGB sample (ensure_rgb=True)" if self.ensure_rgb else ""
            raise ValueError(
                f"only {n_ids} eligible identities{why} in {type(dataset).__name__}, but a step needs "
                f"P x world_size = {self.num_ids_per_batch} x {self.world_size} = {pw} distinct identities; "
                f"lower batch_size (P = batch_size / num_instances), raise num_instances, use fewer "
                f"processes{' or set ensure_rgb=False' if self.ensure_rgb else ''}"
            )
        self.epoch_length = epoch_length
        self._fixed_batches: int | None = None
        if fixed_len == "seed":
            num_passes = 1
        elif isinstance(fixed_len, int):
            self._fixed_batches = fixed_len
            num_passes = -(-fixed_len * pw // n_ids)  # passes needed; the last one is cut short
        if num_passes is None:
            per_id = self._eligible_samples / max(n_ids, 1)
            num_passes = max(1, int(round(per_id / self.num_instances)))
        self.num_passes = int(num_passes)
        total = self.num_passes * n_ids
        if self._fixed_batches is not None:
            self.num_batches = self._fixed_batches
        else:
            self.num_batches = total // pw if self.drop_last else -(-total // pw)  # per rank, per epoch
        self.setup_seconds = time.perf_counter() - t0
        self.summary: dict[str, Any] = {
            "samples": self.num_samples,
            "ids": self.num_ids,
            "eligible_ids": n_ids,
            "pairable_ids": self.num_pairable_ids,
            "modalities": self.modality_names,
            "P": self.num_ids_per_batch,
            "K": self.num_instances,
            "num_passes": self.num_passes,
            "epoch_length": epoch_length,
            "batches_per_epoch": self.num_batches,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
            "setup_seconds": self.setup_seconds,
        }
        if logger.isEnabledFor(logging.INFO):  # for users who configure logging; describe() is the data
            logger.info("%s", self.describe())

    @property
    def cache_summary(self) -> dict[str, Any]:
        """What was cached and what an epoch looks like, as data (a copy of `summary`)."""
        return dict(self.summary)

    def describe(self) -> str:
        """The cache summary as lines for a log, in the spirit of the usual "metadata cached" block."""
        s = self.summary
        pct = 100.0 * s["pairable_ids"] / max(s["ids"], 1)
        how = {"auto": "auto: about one look per sample", "seed": "seed: one pass over the identities"}.get(
            str(s["epoch_length"]), f"fixed at {s['epoch_length']}"
        )
        mods = list(s["modalities"])
        if len(mods) > 1:
            ids = (f"ids: {s['ids']} ({s['eligible_ids']} eligible, {s['pairable_ids']} pairable = {pct:.1f}% with "
                   f"RGB and non-RGB samples); modalities: {', '.join(mods)}")  # fmt: skip
        else:  # Market-1501 and the like: "0 pairable = 0.0%" would read like an alarm
            ids = (f"ids: {s['ids']} ({s['eligible_ids']} eligible); one modality ({', '.join(mods) or 'none'}): "
                   "cross-modality pairing does not apply")  # fmt: skip
        return (
            f"CachedModalAwarePKSampler: metadata of {s['samples']} samples cached in {s['setup_seconds']:.4f} s\n"
            f"  {ids}\n"
            f"  P x K = {s['P']} x {s['K']}; {s['batches_per_epoch']} batches per epoch per rank "
            f"({s['num_passes']} pass(es) over the identities, epoch_length {how}; world_size {s['world_size']})"
        )

    def loader(self, dataset: Any, **kwargs: Any) -> Any:
        """`torch.utils.data.DataLoader(dataset, batch_sampler=self, **kwargs)`, with the batch_sampler rule
        explained: batch_size, shuffle, sampler and drop_last belong to this sampler, not to the loader."""
        from torch.utils.data import DataLoader  # torch only where a loader is wanted

        if "drop_last" in kwargs:
            dl = kwargs.pop("drop_last")
            if bool(dl) != self.drop_last:
                raise ValueError(_batch_sampler_rule(f"drop_last={dl!r}", f"drop_last={bool(dl)}", self))
        for key, fix in (("batch_size", "batch_size="), ("shuffle", "seed=/set_epoch() (it always shuffles)"),
                         ("sampler", "the sampler itself")):  # fmt: skip
            if key in kwargs and not (key == "batch_size" and kwargs[key] == self.batch_size):
                raise ValueError(_batch_sampler_rule(f"{key}={kwargs[key]!r}", fix, self))
            kwargs.pop(key, None)
        return DataLoader(dataset, batch_sampler=self, **kwargs)

    # ---------------------------------------------------------------------------------- construction
    def _build_index(self, pids: np.ndarray, masks: np.ndarray) -> None:
        """Group sample indices by (identity, class) once: per identity, four contiguous segments

        class 0: RGB only | 1: RGB + other, not complete | 2: complete | 3: no RGB
        so "RGB carriers" are segments 0-2 and "non-RGB carriers" segments 1-3 (when the dataset has a
        non-RGB modality at all), and each draw is an offset into a contiguous range.
        """
        full = int(np.bitwise_or.reduce(masks)) if len(masks) else 0
        self._full_has_nonrgb = bool(full & ~_RGB_BIT)
        valid = pids >= 0
        vp = pids[valid]
        if len(vp) == 0:
            raise ValueError("CachedModalAwarePKSampler: every pid is negative (junk); there is nothing to sample")
        # identity codes 0..n_ids-1: a lookup table when pids are small ints (O(N)), else np.unique
        pmax = int(vp.max())
        if pmax < 4 * len(vp) + 4096:
            present = np.bincount(vp, minlength=pmax + 1) > 0
            lut = np.cumsum(present) - 1
            codes = lut[vp]
            uniq = np.flatnonzero(present)
        else:
            uniq, codes = np.unique(vp, return_inverse=True)
        n_all = len(uniq)
        m = masks[valid]
        has_rgb = (m & _RGB_BIT) != 0
        cls = np.where(m == full, 2, np.where(m == _RGB_BIT, 0, np.where(has_rgb, 1, 3)))
        if not full & _RGB_BIT:  # no RGB anywhere: "complete" samples carry no RGB, keep them in class 3
            cls = np.full(len(m), 3)
        key = codes * 4 + cls
        counts = np.bincount(key, minlength=n_all * 4).reshape(n_all, 4)
        # stable counting-sort order; a 32-bit key lets numpy use its radix sort
        order = np.flatnonzero(valid)[np.argsort(key.astype(np.int32 if n_all < 2**28 else np.int64), kind="stable")]
        id_start = np.concatenate([[0], np.cumsum(counts.sum(1))[:-1]])
        rgb_count = counts[:, 0] + counts[:, 1] + counts[:, 2]
        nonrgb_count = counts[:, 1] + counts[:, 3] + (counts[:, 2] if self._full_has_nonrgb else 0)
        eligible = rgb_count > 0 if self.ensure_rgb else counts.sum(1) > 0
        self.num_ids = n_all
        self.num_pairable_ids = int(np.count_nonzero((rgb_count > 0) & (nonrgb_count > 0)))
        self.eligible_pids = uniq[eligible]
        self.num_eligible_ids = int(eligible.sum())
        self._order = order
        self._start = id_start[eligible]
        self._counts = counts[eligible]
        self._eligible_samples = int(self._counts.sum())

    # ------------------------------------------------------------------------------------ protocol
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose batches the next `__iter__` yields (reshuffles identities and samples)."""
        epoch = int(epoch)
        if self._resume_epoch is not None and epoch != self._resume_epoch:
            self._resume_epoch, self._resume_from = None, 0  # moving on from the resumed epoch
        self.epoch = epoch

    def __len__(self) -> int:
        """Batches the next `__iter__` yields: num_batches, or fewer right after a mid-epoch resume."""
        return self.num_batches - self._skip()

    def _skip(self) -> int:
        return self._resume_from if self._resume_epoch == self.epoch else 0

    def __iter__(self) -> Iterator[list[int]]:
        start = self._skip()
        self._resume_epoch, self._resume_from = None, 0
        batches = self.epoch_batches(self.epoch)[start:].tolist()  # one conversion, not one per batch
        self._batches_done = start
        for b in batches:
            self._batches_done += 1  # counts what was handed out (DataLoader prefetch runs ahead of use)
            yield b

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "batches_done": self._batches_done,
            "num_batches": self.num_batches,
            "batch_size": self.batch_size,
            "num_instances": self.num_instances,
            "num_passes": self.num_passes,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next `__iter__` yields batches `batches_done ..` of epoch `state["epoch"]`."""
        for k in ("batch_size", "num_instances", "num_passes", "num_batches", "world_size"):
            if k in state and int(state[k]) != getattr(self, k):
                raise ValueError(
                    f"CachedModalAwarePKSampler.load_state_dict: the checkpoint has {k}={state[k]} but this "
                    f"sampler has {k}={getattr(self, k)}; resume with the same setting or start a new run"
                )
        done = int(state.get("batches_done", 0))
        if not 0 <= done <= self.num_batches:
            raise ValueError(f"load_state_dict: batches_done={done} is outside 0..{self.num_batches}")
        self.seed = int(state.get("seed", self.seed))
        self.epoch = int(state["epoch"])
        self._resume_epoch, self._resume_from = self.epoch, done
        self._batches_done = done

    # ------------------------------------------------------------------------------------ drawing
    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, int(epoch), 0x9E1D])  # private; global RNGs untouched

    def _id_sequence(self, rng: np.random.Generator) -> np.ndarray:
        """Positions into the eligible identities, length num_batches * P * world_size, no identity
        twice within one step (a step = the P * world_size identities of one batch on every rank)."""
        n, pw = self.num_eligible_ids, self.num_ids_per_batch * self.world_size
        parts: list[np.ndarray] = []
        filled = 0
        for _ in range(self.num_passes):  # (a fixed epoch_length cuts the last pass short below)
            perm = rng.permutation(n)
            t = filled % pw  # identities already in the step that this pass's head completes
            if t:
                tail = parts[-1][-t:] if len(parts[-1]) >= t else np.concatenate(parts)[-t:]
                dup = np.isin(perm, tail)
                # n >= pw, so at least pw - t identities are not in the tail: they go first
                perm = np.concatenate([perm[~dup], perm[dup]])
            parts.append(perm)
            filled += n
        seq = np.concatenate(parts)
        if self._fixed_batches is not None:
            return seq[: self._fixed_batches * pw]
        rem = len(seq) % pw
        if rem:
            if self.drop_last:
                seq = seq[: len(seq) - rem]
            else:  # pad the last step with identities not already in it
                tail = seq[-rem:]
                pool = np.setdiff1d(np.arange(n), tail)
                seq = np.concatenate([seq, rng.permutation(pool)[: pw - rem]])
        return seq

    def _draw(self, ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """K sample indices for each identity position in `ids` -> (len(ids), K), vectorised."""
        K, C = self.num_instances, len(ids)
        cnt = self._counts[ids]
        c0, c1, c2, c3 = cnt[:, 0], cnt[:, 1], cnt[:, 2], cnt[:, 3]
        n = cnt.sum(1)
        big = np.iinfo(np.int64).max // 4
        pos = np.full((C, K), -1, dtype=np.int64)  # positions inside the identity's segment
        anchors = np.zeros(C, dtype=np.int64)
        q0 = np.full(C, big)
        q1 = np.full(C, big)

        def pick(lo: np.ndarray, length: np.ndarray) -> np.ndarray:
            return lo + np.minimum((rng.random(len(lo)) * length).astype(np.int64), np.maximum(length - 1, 0))

        if self.ensure_rgb:
            use_c = (c2 > 0) if self.prefer_complete else np.zeros(C, dtype=bool)
            p0 = pick(np.where(use_c, c0 + c1, 0), np.where(use_c, c2, c0 + c1 + c2))
            q0 = p0
            anchors[:] = 1
            carries_nonrgb = (p0 >= c0) & self._full_has_nonrgb
            n_nonrgb = c1 + c3 + (c2 if self._full_has_nonrgb else 0)
            need = (K >= 2) & ~carries_nonrgb & (n_nonrgb > 0)
            p1 = pick(c0, n_nonrgb)  # segments 1..3 start at c0; p0 is in segment 0 where needed
            q1 = np.where(need, p1, big)
            anchors += need
            pos[:, 0] = p0
            if K >= 2:
                pos[need, 1] = p1[need]
        elif self.prefer_complete:
            has_c = c2 > 0
            p0 = pick(c0 + c1, c2)
            q0 = np.where(has_c, p0, big)
            anchors += has_c
            pos[has_c, 0] = p0[has_c]
        # the rest: Floyd's algorithm draws r = K - anchors distinct values from the m = n - anchors
        # non-anchor positions; where m < r the first r - m slots are draws with replacement from all n
        r = K - anchors
        m = n - anchors
        lo_q, hi_q = np.minimum(q0, q1), np.maximum(q0, q1)
        rest = np.full((C, K), -1, dtype=np.int64)
        rows = np.arange(C)
        for s in range(K):
            live = s < r
            j = m - r + s
            floyd = live & (j >= 0)
            t = (rng.random(C) * np.maximum(j + 1, 1)).astype(np.int64)
            t = np.minimum(t, np.maximum(j, 0))
            seen = (rest[:, :s] == t[:, None]).any(1) if s else np.zeros(C, dtype=bool)
            v = np.where(seen, j, t)
            v = v + (v >= lo_q)  # skip the anchor positions
            v = v + (v >= hi_q)
            repl = live & (j < 0)
            vr = np.minimum((rng.random(C) * n).astype(np.int64), n - 1)
            val = np.where(floyd, v, np.where(repl, vr, -1))
            rest[:, s] = np.where(floyd, np.where(seen, j, t), -1)  # Floyd bookkeeping in rest space
            col = anchors + s
            ok = live
            pos[rows[ok], col[ok]] = val[ok]
        return self._order[self._start[ids][:, None] + pos]

    def epoch_batches(self, epoch: int) -> np.ndarray:
        """All of this rank's batches of `epoch` as an int64 array (num_batches, P * K)."""
        rng = self._rng(epoch)
        P, W = self.num_ids_per_batch, self.world_size
        seq = self._id_sequence(rng)
        steps = len(seq) // (P * W)
        mine = seq.reshape(steps, W, P)[:, self.rank, :].reshape(-1)
        return self._draw(mine, rng).reshape(steps, P * self.num_instances)
