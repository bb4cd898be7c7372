"""Hostile inputs to the data layer: a full disk while the ERA5 cache or the sample file is written, a crashed
build's temp file, unsorted coordinate axes, re-ID folders whose evaluation cannot be scored, huge images and
file names that only look like Market-1501's. Every refusal is one line naming the file, and nothing is left
behind on disk. The disk is never really filled: shutil.disk_usage and os.posix_fallocate are stood in for."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datasets import era5_cache, free_space
from datasets.era5 import ERA5SSTMonthlyDataset
from datasets.era5_files import axis_problem, scan_file
from datasets.era5_sample import ensure_sample_file, main, sample_nbytes, write_sample_file
from datasets.reid import (
    ReIDEvalSet,
    SyntheticCrossModalReID,
    _scan_market,
    eval_set_problem,
    image_problem,
    read_market1501,
    read_sysu_mm01,
)
from utils.reid_eval import retrieval_metrics

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
GRID, RES = 5.0, 10.0


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return write_sample_file(tmp_path_factory.mktemp("src") / "cf.nc", layout="cf", grid=GRID, months=30)


def fake_disk(monkeypatch, free_of):
    """Stand in for shutil.disk_usage: `free_of(folder)` bytes are free."""

    def usage(folder):
        free = int(free_of(Path(folder)))
        return shutil._ntuple_diskusage(10**12, 10**12 - free, free)  # type: ignore[attr-defined]

    monkeypatch.setattr(shutil, "disk_usage", usage)


def one_line_enospc(e: pytest.ExceptionInfo, filename: Path) -> str:
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(filename)
    msg = str(e.value.strerror)
    assert "\n" not in str(e.value) and str(filename.parent) in msg and "free" in msg and "needs" in msg
    return msg


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# ---- free space ---------------------------------------------------------------------------------------------
@given(nbytes=st.integers(0, 2**40), free=st.integers(0, 2**41))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_require_free_space_refuses_exactly_when_the_bytes_and_margin_do_not_fit(monkeypatch, nbytes, free):
    fake_disk(monkeypatch, lambda _: free)
    target = Path(tempfile.gettempdir()) / "era5_x.npy"
    if free >= free_space.needed_bytes(nbytes):
        free_space.require_free_space(target, nbytes, "free space")
    else:
        with pytest.raises(OSError) as e:
            free_space.require_free_space(target, nbytes, "free space there")
        assert one_line_enospc(e, target).endswith("free space there")
    assert free_space.needed_bytes(nbytes) >= nbytes + free_space.MARGIN_BYTES


def test_a_full_disk_refuses_the_cache_build_before_writing_and_names_the_fix(source, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    fake_disk(monkeypatch, lambda _: 5 * 2**20)  # 5 MB free: less than the margin alone
    with pytest.raises(OSError) as e:
        ERA5SSTMonthlyDataset(data_path=source, cache_dir=cache, resolution=RES, split=None)
    assert e.value.filename.endswith(".npy") and Path(e.value.filename).parent == cache
    msg = one_line_enospc(e, Path(e.value.filename))
    assert "--cache_dir" in msg and "$PLAINLOOP_CACHE" in msg
    assert leftovers(cache) == []  # no temp file, no half cache
    monkeypatch.undo()
    ds = ERA5SSTMonthlyDataset(data_path=source, cache_dir=cache, resolution=RES, split=None)
    assert ds.info["cache"] == "miss" and len(ds) > 0  # room again: it builds


def test_a_disk_that_fills_during_the_build_fails_with_enospc_not_sigbus(source, tmp_path, monkeypatch):
    """The blocks are allocated before the memory map is written; a full disk then is an OSError, not SIGBUS."""
    if not hasattr(os, "posix_fallocate"):
        pytest.skip("no posix_fallocate on this platform")
    cache = tmp_path / "cache"

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError) as e:
        ERA5SSTMonthlyDataset(data_path=source, cache_dir=cache, resolution=RES, split=None)
    one_line_enospc(e, Path(e.value.filename))
    assert leftovers(cache) == []


def test_a_failing_build_leaves_no_temp_file(source, tmp_path, monkeypatch):
    cache = tmp_path / "cache"

    def broken(*a, **k):
        raise ValueError("read error in the middle of the build")

    monkeypatch.setattr(era5_cache, "coarsen", broken)
    with pytest.raises(ValueError, match="middle of the build"):
        ERA5SSTMonthlyDataset(data_path=source, cache_dir=cache, resolution=RES, split=None)
    assert leftovers(cache) == []


def test_a_crashed_builds_temp_file_is_removed_with_a_line_not_reported_as_a_full_disk(
    source, tmp_path, monkeypatch, caplog
):
    """A build killed by SIGBUS a moment ago (this host, its pid gone) left 20 MB; the disk only has room once
    that file is gone. The next start removes it at once, says so, and builds."""
    cache = tmp_path / "cache"
    cache.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = era5_cache.temp_name(cache / "era5_0123456789abcdef0123.npy", npy=True)
    stale = stale.with_name(stale.name.replace(f"~{os.getpid()}.", f"~{dead.pid}."))
    with open(stale, "wb") as f:
        f.truncate(20 * 10**6)  # sparse: the size is real to the code, the disk is not touched
    need = free_space.needed_bytes(30 * 16 * 36 * 4 + 4096)  # 30 months of 16 x 36 cells

    def free_of(folder):  # a disk with room for the cache only when the temp file is gone
        used = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        return need + 10**6 - used

    fake_disk(monkeypatch, free_of)
    with caplog.at_level(logging.WARNING, logger="datasets.era5"):
        ds = ERA5SSTMonthlyDataset(data_path=source, cache_dir=cache, resolution=RES, split=None)
    assert not stale.exists() and ds.info["cache"] == "miss"
    lines = [r.getMessage() for r in caplog.records if "interrupted build" in r.getMessage()]
    assert len(lines) == 1 and str(stale) in lines[0] and "20.0 MB" in lines[0]


def test_another_hosts_temp_file_is_kept_and_named_in_the_full_disk_error(source, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    other = cache / ".era5_0123.npy.otherhost~1.tmp.npy"  # may be a live build on another machine
    other.write_bytes(b"x" * 100)
    fake_disk(monkeypatch, lambda _: 0)
    with pytest.raises(OSError) as e:
        ERA5SSTMonthlyDataset(data_path=source, cache_dir=cache, resolution=RES, split=None)
    msg = one_line_enospc(e, Path(e.value.filename))
    assert "1 temp file(s)" in msg and str(other) in msg
    assert leftovers(cache) == [other.name]


def test_the_sample_file_on_a_nearly_full_disk_is_one_enospc_line_and_nothing_written(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    need = free_space.needed_bytes(sample_nbytes("legacy", 36, 5.0))
    fake_disk(monkeypatch, lambda _: need - 1)
    with pytest.raises(OSError) as e:
        ensure_sample_file(cache, years=3, grid=5.0)
    name = cache / "era5_sample_v2_legacy_3y_5deg_seed0.nc"
    assert "$PLAINLOOP_CACHE" in one_line_enospc(e, name)
    assert leftovers(cache) == []
    fake_disk(monkeypatch, lambda _: need)
    assert ensure_sample_file(cache, years=3, grid=5.0) == name and leftovers(cache) == [name.name]


@pytest.mark.parametrize("layout", ["legacy", "cds2024", "cf"])
def test_the_sample_size_estimate_covers_the_written_file(tmp_path, layout):
    for expver in (False, True) if layout == "legacy" else (False,):
        p = write_sample_file(tmp_path / f"{layout}{expver}.nc", layout=layout, grid=5.0, months=24, expver_dim=expver)
        assert p.stat().st_size <= free_space.needed_bytes(sample_nbytes(layout, 24, 5.0, expver))


def test_the_sample_cli_on_a_full_disk_exits_4_with_one_line(tmp_path, monkeypatch, capsys):
    fake_disk(monkeypatch, lambda _: 0)
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "out.nc"), "--years", "1", "--grid", "5"])
    err = capsys.readouterr().err
    assert e.value.code == 4 and err.count("\n") == 1 and "not enough free space" in err
    assert leftovers(tmp_path) == []


# ---- coordinate axes ----------------------------------------------------------------------------------------
def _strict(v: np.ndarray) -> bool:
    d = np.diff(v)
    return bool((d > 0).all() or (d < 0).all())


@given(st.lists(st.integers(-90, 90), min_size=2, max_size=12))
@settings(max_examples=300, deadline=None)
def test_axis_problem_accepts_exactly_strictly_monotonic_axes(values):
    v = np.asarray(values, dtype=float)
    assert (axis_problem(v) is None) == _strict(v)
    if not _strict(v):
        assert " at index " in axis_problem(v)  # type: ignore[operator]


@given(n=st.integers(4, 36), start=st.integers(0, 35), descending=st.booleans())
@settings(max_examples=100, deadline=None)
def test_a_longitude_axis_may_wrap_once_around_the_circle(n, start, descending):
    step = 360.0 / n
    lon = np.mod(start * 10.0 + step * np.arange(n), 360.0)
    lon = lon[::-1] if descending else lon
    assert axis_problem(lon, circular=True) is None
    bad = lon.copy()  # swapping two neighbours breaks it (3 points are in circular order whatever their order)
    bad[[0, 1]] = bad[[1, 0]]
    assert axis_problem(bad, circular=True) is not None


@pytest.fixture(scope="module")
def cf_file(tmp_path_factory) -> Path:
    return write_sample_file(tmp_path_factory.mktemp("axes") / "cf.nc", layout="cf", grid=30.0, months=2)


@given(data=st.data(), which=st.sampled_from(["lat", "lon"]))
@settings(max_examples=20, deadline=None)
def test_a_file_with_an_unsorted_coordinate_axis_is_refused_naming_file_and_variable(cf_file, data, which):
    with netCDF4.Dataset(cf_file) as nc:
        axis = np.asarray(nc[which][:], dtype=float)
    order = data.draw(st.permutations(range(axis.size)))
    shuffled = axis[list(order)]
    if which == "lon":  # rotations are a valid wrapped axis; any other order is not
        ok = axis_problem(shuffled, circular=True) is None
    else:
        ok = _strict(shuffled)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "shuffled.nc"
        shutil.copy(cf_file, p)
        with netCDF4.Dataset(p, "a") as nc:
            nc[which][:] = shuffled
        if ok:
            scan_file(p)
        else:
            with pytest.raises(ValueError) as e:
                scan_file(p)
            msg = str(e.value)
            assert msg.startswith(f"{p}: coordinate '{which}' ") and "\n" not in msg and "sort" in msg


def test_an_unsorted_latitude_stops_the_dataset_before_any_cache_is_written(cf_file, tmp_path):
    p = tmp_path / "lat.nc"
    shutil.copy(cf_file, p)
    with netCDF4.Dataset(p, "a") as nc:
        lat = np.asarray(nc["lat"][:])
        nc["lat"][:] = lat[[0, 2, 1, 3, 4, 5]]
    with pytest.raises(ValueError, match=r"coordinate 'lat' is not monotonic: -45 at index 2 follows -15"):
        ERA5SSTMonthlyDataset(data_path=p, cache_dir=tmp_path / "cache", resolution=30.0, split=None)
    assert leftovers(tmp_path / "cache") == []


# ---- re-ID evaluation sets ----------------------------------------------------------------------------------
class _Meta:
    def __init__(self, pids, cams):
        self.pids, self.camids = np.asarray(pids, dtype=np.int64), np.asarray(cams, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.pids)

    def __getitem__(self, i):
        raise AssertionError("the check reads metadata only")


@given(
    pids=st.lists(st.integers(0, 4), min_size=2, max_size=16),
    cams=st.data(),
    split=st.data(),
    excluded=st.sampled_from([(), ((3, 2), (2, 3))]),
)
@settings(max_examples=200, deadline=None)
def test_eval_set_check_refuses_exactly_what_the_metric_would_refuse(pids, cams, split, excluded):
    n = len(pids)
    cam = cams.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    nq = split.draw(st.integers(0, n))
    ev = ReIDEvalSet(_Meta(pids, cam), {"p": (np.arange(nq), np.arange(nq, n))}, excluded)
    feats = np.random.default_rng(0).standard_normal((n, 4))
    try:
        retrieval_metrics(feats, ev.dataset.pids, ev.dataset.camids, ev.protocols, excluded)
        scorable = True
    except ValueError:
        scorable = False
    assert (eval_set_problem(ev) is None) == scorable


def _img(path: Path, size=(8, 16), mode="RGB") -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size).save(path)


def _market(root: Path, train, query, test) -> None:
    for folder, names in (("bounding_box_train", train), ("query", query), ("bounding_box_test", test)):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for n in names:
            _img(root / folder / n)


TRAIN = [f"{p:04d}_c{c}s1_00000{f}_00.jpg" for p in range(1, 7) for c in (1, 2) for f in (1, 2)]


def test_a_market_gallery_sharing_no_identity_with_the_query_is_refused_when_the_task_is_built(tmp_path):
    pytest.importorskip("PIL")
    from tasks.reid import build_reid_task

    _market(tmp_path, TRAIN, ["0101_c1s1_000001_00.jpg"], ["0202_c2s1_000001_00.jpg", "0203_c2s1_000002_00.jpg"])
    with pytest.raises(ValueError) as e:
        build_reid_task(data_path=str(tmp_path), reid_format="market1501", width=4)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path} (test: query/ against bounding_box_test/)") and "\n" not in msg
    assert "share 0 with the gallery's 2" in msg


def test_a_market_validation_split_with_nothing_to_match_is_refused_before_training(tmp_path):
    pytest.importorskip("PIL")
    one_per_camera = [f"{p:04d}_c{c}s1_000001_00.jpg" for p in range(1, 11) for c in (1, 2)]
    _market(tmp_path, one_per_camera, ["0101_c1s1_000001_00.jpg"], ["0101_c2s1_000001_00.jpg"])
    with pytest.raises(ValueError) as e:
        read_market1501(tmp_path, val_fraction=0.2)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'bounding_box_train'} (validation") and "empty gallery" in msg
    assert "--val_fraction" in msg and "\n" not in msg
    train, val, test = read_market1501(tmp_path, val_fraction=0)  # no validation: fine
    assert val is None and len(test) == 2


def _sysu(root: Path, val_images: bool) -> None:
    (root / "exp").mkdir(parents=True)
    (root / "exp" / "train_id.txt").write_text("1,2,3")
    (root / "exp" / "val_id.txt").write_text("4,5")
    (root / "exp" / "test_id.txt").write_text("6,7")
    for pid in (1, 2, 3, 6, 7) + ((4, 5) if val_images else ()):
        for cam in (1, 3):
            _img(root / f"cam{cam}" / f"{pid:04d}" / "0001.jpg")
    for cam in range(1, 7):
        (root / f"cam{cam}").mkdir(exist_ok=True)


def test_a_sysu_validation_list_without_images_is_refused_not_silently_dropped(tmp_path):
    pytest.importorskip("PIL")
    _sysu(tmp_path, val_images=False)
    with pytest.raises(ValueError) as e:
        read_sysu_mm01(tmp_path, trials=2)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path}: exp/val_id.txt lists 2 validation identities") and "--val_fraction 0" in msg
    train, val, test = read_sysu_mm01(tmp_path, trials=2, hold_out_val_ids=False)
    assert val is None and len(test) == 4


def test_eval_sets_of_the_synthetic_set_pass_the_check():
    ds = SyntheticCrossModalReID(4, 4, image_size=(16, 8), relabel=False)
    from datasets.reid import cross_modality_protocols

    assert eval_set_problem(ReIDEvalSet(ds, cross_modality_protocols(ds))) is None
    assert eval_set_problem(ReIDEvalSet(_Meta([], []), {})) == "holds no image"


# ---- re-ID images -------------------------------------------------------------------------------------------
@given(w=st.integers(1, 48), h=st.integers(1, 48), limit=st.integers(1, 2000))
@settings(max_examples=40, deadline=None)
def test_image_size_limit_is_read_from_the_header(w, h, limit):
    pytest.importorskip("PIL")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "a.png"
        _img(p, (w, h))
        why = image_problem(p, max_pixels=limit)
    if w * h > limit:
        assert why is not None and why.startswith(f"has {w} x {h} = {w * h:,} pixels") and "downscale" in why
    else:
        assert why is None


def test_a_huge_png_is_refused_without_being_decoded(tmp_path, monkeypatch):
    pytest.importorskip("PIL")
    from PIL import ImageFile

    big = tmp_path / "bounding_box_train" / "0001_c1s1_000001_00.png"
    _img(big, (5000, 4000), mode="1")  # 20 Mpx: over MAX_IMAGE_PIXELS, a few KB as a PNG
    _market(tmp_path, TRAIN, ["0001_c1s1_000009_00.jpg"], ["0001_c2s1_000009_00.jpg"])
    decoded: list[str] = []
    real_load = ImageFile.ImageFile.load

    def load(self):
        decoded.append(getattr(self, "filename", ""))
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    with pytest.raises(ValueError) as e:
        read_market1501(tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"{big}: has 5000 x 4000 = 20,000,000 pixels, more than the 16,777,216") and "\n" not in msg
    assert str(big) not in decoded


def test_an_image_over_pillows_own_limit_is_one_line_too(tmp_path, monkeypatch):
    pytest.importorskip("PIL")
    from PIL import Image

    p = tmp_path / "a.png"
    _img(p, (100, 100))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 10,000 px > 2 x 1,000: Pillow refuses to open it
    why = image_problem(p, max_pixels=500)
    assert why is not None and why.startswith("has 10,000 pixels, more than the 500")


# ---- Market-1501 file names ---------------------------------------------------------------------------------
NAME = st.tuples(
    st.sampled_from([-1, 0]) | st.integers(1, 1501),
    st.integers(1, 6),
    st.integers(1, 9),
    st.integers(0, 999999),
    st.integers(0, 99),
)


@given(names=st.lists(NAME, min_size=1, max_size=6, unique=True), junk=st.sampled_from(["", " (1)", "_copy", "x"]))
@FAST
def test_market_names_must_match_whole(tmp_path_factory, names, junk):
    pytest.importorskip("PIL")
    folder = tmp_path_factory.mktemp("m")
    files = [f"{p:04d}_c{c}s{s}_{f:06d}_{b:02d}" for p, c, s, f, b in names]
    files = [n.replace("-001", "-1") for n in files]
    for n in files[:-1]:
        _img(folder / f"{n}.jpg")
    _img(folder / f"{files[-1]}{junk}.jpg")
    kept = [(p, c) for p, c, *_ in names if p > 0]
    if junk:
        with pytest.raises(ValueError) as e:
            _scan_market(folder)
        msg = str(e.value)
        assert msg.startswith(f"{folder / (files[-1] + junk + '.jpg')}: not a Market-1501 file name")
        assert "\n" not in msg
    elif not kept:
        with pytest.raises(ValueError, match="no Market-1501 images"):
            _scan_market(folder)
    else:
        paths, pids, cams = _scan_market(folder)
        assert sorted(zip(pids, cams)) == sorted(kept)


def test_bad_market_names_are_counted(tmp_path):
    pytest.importorskip("PIL")
    for n in ("0002_c1s1_000451_03.jpg", "0002_c1s1_000451_03 (1).jpg", "0002_c1_x.jpg", "notes.jpg"):
        _img(tmp_path / n)
    with pytest.raises(ValueError, match=r"\(and 2 more such name\(s\) in "):
        _scan_market(tmp_path)


def test_a_small_synthetic_val_fraction_still_holds_out_one_identity():
    from tasks.reid import build_reid_task

    task = build_reid_task(num_identities=8, val_fraction=0.01, width=4)
    assert task.info["val_identities"] == 1 and task.val_set is not None
