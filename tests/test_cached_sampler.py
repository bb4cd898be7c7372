"""Invariants of CachedModalAwarePKSampler over many seeds, sizes and simulated DDP ranks."""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from datasets.cached_sampler import CachedModalAwarePKSampler, encode_modalities


class Meta(Dataset):
    """Metadata-only dataset: __getitem__ returns (index, pid) so a DataLoader's output can be checked."""

    def __init__(self, pids: Any, camids: Any, modalities: Any) -> None:
        self.pids, self.camids, self.modalities = pids, camids, modalities

    def __len__(self) -> int:
        return len(self.pids)

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, int(self.pids[i])


def make_meta(
    seed: int,
    n_ids: int = 40,
    rgb_only: int = 3,
    ir_only: int = 2,
    few: int = 3,
    multimodal: bool = False,
    junk: int = 5,
) -> Meta:
    """Random cross-modality metadata with awkward identities: RGB-only, IR-only, fewer than 4 samples,
    optional multi-modal (rgb+ir) samples and junk pid -1 entries."""
    rng = np.random.default_rng(seed)
    pids, cams, mods = [], [], []
    for p in range(n_ids):
        pid = 100 + 3 * p  # non-contiguous pids
        n_rgb = int(rng.integers(1, 12))
        n_ir = int(rng.integers(1, 8))
        if p < rgb_only:
            n_ir = 0
        elif p < rgb_only + ir_only:
            n_rgb = 0
        elif p < rgb_only + ir_only + few:
            n_rgb, n_ir = 1, int(rng.integers(0, 2))
        for _ in range(n_rgb):
            pids.append(pid), cams.append(int(rng.choice([1, 2, 4, 5]))), mods.append("rgb")
        for _ in range(n_ir):
            pids.append(pid), cams.append(int(rng.choice([3, 6]))), mods.append("ir")
        if multimodal and p % 3 == 0 and p >= rgb_only + ir_only + few:
            for _ in range(int(rng.integers(1, 3))):
                pids.append(pid), cams.append(7), mods.append(("rgb", "ir"))
    for _ in range(junk):
        pids.append(-1), cams.append(1), mods.append("rgb")
    order = rng.permutation(len(pids))  # interleave identities, as real file lists are
    pids_a = np.asarray(pids)[order]
    cams_a = np.asarray(cams)[order]
    mods_l = [mods[i] for i in order]
    mods_out: Any = np.asarray(mods_l) if not multimodal else mods_l
    return Meta(pids_a, cams_a, mods_out)


def carriers(ds: Meta) -> tuple[np.ndarray, np.ndarray]:
    """(carries rgb, carries non-rgb) per sample, computed independently of the sampler."""
    rgb = np.array([("rgb" in m) if not isinstance(m, str) else m == "rgb" for m in ds.modalities])
    ir = np.array([("ir" in m) if not isinstance(m, str) else m == "ir" for m in ds.modalities])
    return rgb, ir


def check_epoch(ds: Meta, s: CachedModalAwarePKSampler, batches: list[list[int]]) -> None:
    P, K = s.num_ids_per_batch, s.num_instances
    pids = np.asarray(ds.pids)
    rgb, ir = carriers(ds)
    per_id = {p: np.flatnonzero(pids == p) for p in np.unique(pids) if p >= 0}
    assert len(batches) == len(s) or len(batches) == s.num_batches
    for b in batches:
        assert len(b) == P * K and all(isinstance(i, int) for i in b)
        bp = pids[b]
        assert (bp >= 0).all(), "junk pids are never sampled"
        ids, counts = np.unique(bp, return_counts=True)
        assert len(ids) == P and (counts == K).all(), "exactly P identities x K samples"
        for p in ids:
            idx = [i for i in b if pids[i] == p]
            n_avail = len(per_id[p])
            if s.ensure_rgb:
                assert rgb[idx].any(), f"identity {p} has no RGB sample in the batch"
                if ir[per_id[p]].any() and K >= 2:
                    assert ir[idx].any(), f"identity {p} has IR samples but none in the batch"
            if n_avail >= K:
                assert len(set(idx)) == K, f"identity {p} ({n_avail} samples) repeated a sample"
            else:
                assert len(set(idx)) == n_avail, f"identity {p}: all {n_avail} samples used before repeating"


CONFIGS = [  # (batch_size, K, multimodal)
    (16, 4, False),
    (32, 4, True),
    (12, 3, False),
    (8, 1, False),
    (24, 8, True),
    (10, 2, True),
]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("batch_size,K,multimodal", CONFIGS)
def test_composition_and_coverage(seed: int, batch_size: int, K: int, multimodal: bool) -> None:
    ds = make_meta(seed, n_ids=30 + 7 * seed, multimodal=multimodal)
    s = CachedModalAwarePKSampler(ds, batch_size, K, seed=seed, drop_last=False)
    for epoch in (0, 3):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(batches) == len(s) == s.num_batches
        check_epoch(ds, s, batches)
        # coverage: with drop_last=False every eligible identity appears num_passes times (or once more
        # where the last step was padded)
        seen = Counter(int(np.asarray(ds.pids)[b[i]]) for b in batches for i in range(0, len(b), K))
        assert set(seen) == set(s.eligible_pids.tolist())
        assert min(seen.values()) >= s.num_passes
        assert sum(seen.values()) - s.num_passes * s.num_eligible_ids < s.num_ids_per_batch
    # IR-only identities are not eligible under ensure_rgb, and are counted
    rgb, _ = carriers(ds)
    pids = np.asarray(ds.pids)
    ir_only = {p for p in np.unique(pids[pids >= 0]) if not rgb[pids == p].any()}
    assert ir_only and not ir_only & set(s.eligible_pids.tolist())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("passes", [1, 3])
def test_drop_last_len_and_exact_batches(seed: int, passes: int) -> None:
    ds = make_meta(seed, n_ids=37)
    s = CachedModalAwarePKSampler(ds, 20, 4, seed=seed, drop_last=True, num_passes=passes)
    batches = list(s)
    assert len(batches) == len(s) == (passes * s.num_eligible_ids) // 5
    check_epoch(ds, s, batches)


def test_prefer_complete_puts_a_complete_sample_in() -> None:
    ds = make_meta(1, n_ids=40, multimodal=True)
    pids = np.asarray(ds.pids)
    complete = np.array([not isinstance(m, str) for m in ds.modalities])
    with_complete = {p for p in np.unique(pids[complete])}
    for prefer in (True, False):
        s = CachedModalAwarePKSampler(ds, 16, 4, seed=3, prefer_complete=prefer)
        hits = []
        for b in s:
            for p in set(pids[b].tolist()) & with_complete:
                hits.append(complete[[i for i in b if pids[i] == p]].any())
        if prefer:
            assert all(hits)
        else:
            assert not all(hits)  # without the preference some chunks of these ids lack one


def test_without_ensure_rgb_all_ids_are_eligible() -> None:
    ds = make_meta(2)
    s = CachedModalAwarePKSampler(ds, 16, 4, ensure_rgb=False, seed=0)
    pids = np.asarray(ds.pids)
    assert s.num_eligible_ids == len(np.unique(pids[pids >= 0]))
    check_epoch(ds, s, list(s))


@pytest.mark.parametrize("seed", [0, 7, 123])
def test_reproducible_and_set_epoch_reshuffles(seed: int) -> None:
    ds = make_meta(seed)
    a = CachedModalAwarePKSampler(ds, 16, 4, seed=seed)
    b = CachedModalAwarePKSampler(ds, 16, 4, seed=seed)
    assert list(a) == list(b)
    assert list(a) == list(a), "iterating twice without set_epoch repeats the epoch"
    a.set_epoch(1)
    e1 = list(a)
    assert e1 != list(b)
    b.set_epoch(1)
    assert e1 == list(b)
    c = CachedModalAwarePKSampler(ds, 16, 4, seed=seed + 1)
    assert list(c) != list(CachedModalAwarePKSampler(ds, 16, 4, seed=seed))


def test_global_rng_untouched() -> None:
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    before = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    ds = make_meta(0)
    s = CachedModalAwarePKSampler(ds, 16, 4, seed=1)
    for e in range(3):
        s.set_epoch(e)
        list(s)
    after = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    assert before[0] == after[0]
    assert all(np.array_equal(x, y) for x, y in zip(before[1][1:3], after[1][1:3]))
    assert torch.equal(before[2], after[2])


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("drop_last", [True, False])
def test_ranks_disjoint_and_equal_length(world_size: int, seed: int, drop_last: bool) -> None:
    ds = make_meta(seed, n_ids=45)
    pids = np.asarray(ds.pids)
    samplers = [
        CachedModalAwarePKSampler(
            ds, 12, 4, seed=seed, rank=r, world_size=world_size, drop_last=drop_last, num_passes=2
        )
        for r in range(world_size)
    ]
    for s in samplers:
        s.set_epoch(4)
    per_rank = [list(s) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1 and len(per_rank[0]) == len(samplers[0]) > 0
    for s, batches in zip(samplers, per_rank):
        check_epoch(ds, s, batches)
    for step in zip(*per_rank):
        ids = [set(pids[b].tolist()) for b in step]
        assert len(set().union(*ids)) == sum(len(x) for x in ids), "ranks share an identity within a step"
    if drop_last is False:  # together the ranks cover every eligible identity num_passes times
        seen = Counter(int(pids[i]) for batches in per_rank for b in batches for i in b[::4])
        assert min(seen.values()) >= 2 and set(seen) == set(samplers[0].eligible_pids.tolist())


def _raises_quickly(fn: Any, exc: type[BaseException], match: str, timeout: float = 10.0) -> None:
    """fn() must raise `exc` (message matching `match`) within `timeout` seconds: never hang."""
    box: dict[str, BaseException | None] = {"e": None}

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test thread
            box["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} hung for {timeout} s instead of raising"
    assert isinstance(box["e"], exc), f"expected {exc.__name__}, got {box['e']!r}"
    assert match in str(box["e"]), str(box["e"])


def test_error_cases() -> None:
    ds = make_meta(0, n_ids=12)
    S = CachedModalAwarePKSampler
    _raises_quickly(lambda: S(ds, 30, 4), ValueError, "not divisible by num_instances=4")
    _raises_quickly(lambda: S(ds, 8, 0), ValueError, "num_instances=0")
    _raises_quickly(lambda: S(ds, 0, 4), ValueError, "batch_size=0")
    # 12 ids, 2 IR-only -> 10 eligible; P = 8 per rank x 2 ranks = 16 > 10
    _raises_quickly(lambda: S(ds, 32, 4, rank=0, world_size=2), ValueError, "eligible identities")
    _raises_quickly(lambda: S(ds, 44, 4), ValueError, "eligible identities")
    _raises_quickly(lambda: S(Meta([], [], np.asarray([], dtype="<U3")), 8, 4), ValueError, "empty")
    _raises_quickly(lambda: S(Meta([-1, -1], [1, 1], np.asarray(["rgb", "ir"])), 2, 1), ValueError, "negative")
    _raises_quickly(lambda: S(ds, 8, 4, rank=2, world_size=2), ValueError, "rank=2")
    _raises_quickly(lambda: S(ds, 8, 4, rank=0), ValueError, "both or neither")
    _raises_quickly(lambda: S(ds, 8, 4, seed=-1), ValueError, "seed=-1")
    _raises_quickly(lambda: S(Meta([1, 2], [1, 1], np.asarray(["rgb"])), 2, 1), ValueError, "modalities has 1")
    _raises_quickly(lambda: S(Meta([1, 2], [1, 1], ["rgb", ""]), 2, 1), ValueError, "non-empty string")
    _raises_quickly(lambda: S(_NoMeta(), 2, 1), TypeError, "exposes no metadata")
    # only IR identities: nothing is eligible with ensure_rgb
    only_ir = Meta(np.arange(20), np.full(20, 3), np.asarray(["ir"] * 20))
    _raises_quickly(lambda: S(only_ir, 4, 1), ValueError, "ensure_rgb")


class _NoMeta(Dataset):
    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> int:
        return i


class _PerSample(Dataset):
    """No metadata arrays: the sampler makes one pass over get_meta / infer_modalities_of_sample."""

    def __init__(self, base: Meta, seed_style: bool) -> None:
        self.base = base
        if seed_style:
            self.pids = base.pids
            self.camids = base.camids
            self.infer_modalities_of_sample = lambda i: (
                {base.modalities[i]} if isinstance(base.modalities[i], str) else set(base.modalities[i])
            )
        else:
            self.get_meta = lambda i: (base.pids[i], base.camids[i], base.modalities[i])

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> Any:
        return self.base[i]


@pytest.mark.parametrize("kind", ["ndarray", "list", "tuples", "get_meta", "seed_style"])
def test_metadata_sources_agree(kind: str) -> None:
    base = make_meta(4)
    ref = CachedModalAwarePKSampler(base, 16, 4, seed=9)
    if kind == "ndarray":
        ds: Any = base
    elif kind == "list":
        ds = Meta(list(base.pids), list(base.camids), [str(m) for m in base.modalities])
    elif kind == "tuples":
        ds = Meta(base.pids, base.camids, [(str(m),) for m in base.modalities])
    else:
        ds = _PerSample(base, seed_style=kind == "seed_style")
    s = CachedModalAwarePKSampler(ds, 16, 4, seed=9)
    assert list(s) == list(ref)


def test_encode_modalities_aliases_and_sets() -> None:
    masks, names = encode_modalities(["RGB", "visible", "ir", {"rgb", "ir"}, ("thermal",)])
    assert names == ["rgb", "ir", "thermal"]
    assert masks.tolist() == [1, 1, 2, 3, 4]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_two_epochs(workers: int) -> None:
    ds = make_meta(3)
    s = CachedModalAwarePKSampler(ds, 16, 4, seed=11)
    loader = DataLoader(ds, batch_sampler=s, num_workers=workers)
    for epoch in range(2):
        s.set_epoch(epoch)
        got = [idx.tolist() for idx, _ in loader]
        assert len(got) == len(loader) == len(s)
        assert got == s.epoch_batches(epoch).tolist()
        check_epoch(ds, s, got)


@pytest.mark.parametrize("done", [0, 1, 5])
def test_resume_mid_epoch(done: int) -> None:
    ds = make_meta(5)
    a = CachedModalAwarePKSampler(ds, 16, 4, seed=2)
    a.set_epoch(3)
    full = list(a)
    a.set_epoch(3)
    it = iter(a)
    for _ in range(done + 2):  # the loader prefetches ahead of what the loop consumed...
        next(it)
    state = a.state_dict()
    state["batches_done"] = done  # ...so the engine records what it actually used
    b = CachedModalAwarePKSampler(ds, 16, 4, seed=99)  # the checkpointed seed wins
    b.load_state_dict(state)
    b.set_epoch(3)  # the engine may call set_epoch for the resumed epoch: the skip survives
    assert len(b) == len(full) - done
    assert list(b) == full[done:]
    assert len(b) == len(full), "the skip is one-shot"
    b.set_epoch(4)
    a.set_epoch(4)
    assert list(b) == list(a)


def test_resume_with_other_settings_is_refused() -> None:
    ds = make_meta(5)
    state = CachedModalAwarePKSampler(ds, 16, 4).state_dict()
    with pytest.raises(ValueError, match="num_instances=4"):
        CachedModalAwarePKSampler(ds, 16, 2).load_state_dict(state)


# ------------------------------------------------------------------ seed 004: summary, loader rule, epoch length
def test_cache_summary_is_data_and_describe_names_the_figures() -> None:
    ds = make_meta(2, n_ids=40)
    s = CachedModalAwarePKSampler(ds, 32, 4, epoch_length="seed")
    summ = s.cache_summary
    assert summ["samples"] == len(ds) and summ["ids"] == 40 and summ["P"] == 8 and summ["K"] == 4
    assert summ["eligible_ids"] == s.num_eligible_ids and summ["batches_per_epoch"] == len(s)
    summ["ids"] = -1  # a copy: the sampler's own record is untouched
    assert s.cache_summary["ids"] == 40
    text = s.describe()
    for part in (f"{len(ds)} samples", "ids: 40", f"{s.num_pairable_ids} pairable", f"{len(s)} batches per epoch",
                 "P x K = 8 x 4", "epoch_length seed"):  # fmt: skip
        assert part in text, (part, text)


def test_describe_says_plainly_when_the_data_has_one_modality() -> None:
    """Market-1501 printed "0 pairable = 0.0% with RGB and non-RGB samples", which read like an alarm."""
    pids = np.repeat(np.arange(10), 6)
    rgb = Meta(pids, np.tile([1, 2, 3], 20), np.full(len(pids), "rgb"))
    text = CachedModalAwarePKSampler(rgb, 16, 4).describe()
    assert "one modality (rgb): cross-modality pairing does not apply" in text and "pairable" not in text, text
    assert "ids: 10 (10 eligible)" in text
    two = CachedModalAwarePKSampler(make_meta(2), 16, 4).describe()
    assert "35 pairable = 87.5% with RGB and non-RGB samples); modalities: rgb, ir" in two, two


def test_dataloader_drop_last_rule_is_explained() -> None:
    ds = make_meta(3)
    s = CachedModalAwarePKSampler(ds, 16, 4, seed=1, drop_last=True)
    # what PyTorch itself does with the seed's DataLoader(batch_sampler=..., drop_last=True)
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(ds, batch_sampler=s, drop_last=True)
    loader = s.loader(ds, num_workers=0, drop_last=True, batch_size=16)  # agrees with the sampler: fine
    assert [idx.tolist() for idx, _ in loader] == s.epoch_batches(0).tolist()
    with pytest.raises(ValueError, match=r"Set drop_last=False on the sampler instead") as e:
        s.loader(ds, drop_last=False)
    # the sampler's current settings, not shown as if they were the fix ("Set drop_last=False ... (...,
    # drop_last=True)" read as a contradiction)
    assert "(this one has batch_size=16, drop_last=True)" in str(e.value)
    assert "mutually exclusive" in str(e.value)
    with pytest.raises(ValueError, match="shuffle=True cannot be combined"):
        s.loader(ds, shuffle=True)
    with pytest.raises(ValueError, match="batch_size=32 cannot be combined"):
        s.loader(ds, batch_size=32)


@pytest.mark.parametrize("world_size", [1, 2])
def test_epoch_length_seed_and_fixed(world_size: int) -> None:
    ds = make_meta(4, n_ids=45)
    S = CachedModalAwarePKSampler
    seed_len = S(ds, 16, 4, epoch_length="seed", rank=0, world_size=world_size)
    assert len(seed_len) == seed_len.num_eligible_ids // (4 * world_size)
    assert len(seed_len) == len(S(ds, 16, 4, num_passes=1, rank=0, world_size=world_size))
    auto = S(ds, 16, 4, rank=0, world_size=world_size)
    assert len(auto) == len(S(ds, 16, 4, epoch_length="auto", rank=0, world_size=world_size))
    for n in (1, 7, 40):  # shorter than one pass, and several passes
        ranks = [S(ds, 16, 4, epoch_length=n, seed=3, rank=r, world_size=world_size) for r in range(world_size)]
        per_rank = [list(r) for r in ranks]
        assert all(len(b) == len(r) == n for b, r in zip(per_rank, ranks))
        for r, b in zip(ranks, per_rank):
            check_epoch(ds, r, b)
        for step in zip(*per_rank):  # still no identity twice in a step, across ranks too
            pids = np.concatenate([np.asarray(ds.pids)[b][::4] for b in step])
            assert len(set(pids.tolist())) == len(pids)
    assert len(S(ds, 16, 4, epoch_length="12")) == 12  # as a CLI string
    for bad in ("long", 0, -3, 2.5, True):
        with pytest.raises(ValueError, match="epoch_length"):
            S(ds, 16, 4, epoch_length=bad)
    with pytest.raises(ValueError, match="give one of them"):
        S(ds, 16, 4, epoch_length="seed", num_passes=2)


def test_file_copies_alone_without_torch(tmp_path) -> None:
    """datasets/cached_sampler.py must work copied into another repo: stdlib + numpy, torch only when used."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    shutil.copy(Path(__file__).resolve().parents[1] / "datasets" / "cached_sampler.py", tmp_path / "pk.py")
    code = (
        "import sys, numpy as np, pk\n"
        "class D:\n"
        "    pids = np.repeat(np.arange(12), 4); modalities = np.array(['rgb', 'ir'] * 24)\n"
        "    def __len__(self): return 48\n"
        "s = pk.CachedModalAwarePKSampler(D(), 8, 4, epoch_length='seed')\n"
        "assert len(list(s)) == 6 and 'torch' not in sys.modules, sys.modules.keys()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
