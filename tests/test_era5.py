"""ERA5 SST data layer on small generated files (2.5° grid, a few years): values, layouts, errors, cache."""

import os
import pickle
import time

import netCDF4
import numpy as np
import pytest
import torch

from datasets import era5_cache, era5_files, era5_grid
from datasets.era5 import ERA5SSTMonthlyDataset
from datasets.era5_sample import grid_coords, main, sst_celsius, write_sample_file

GRID, RES, MONTHS, SEED = 2.5, 5.0, 30, 3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("era5")
    out = {}
    for name, kw in {
        "legacy": {"layout": "legacy"},
        "cds2024": {"layout": "cds2024"},
        "cf": {"layout": "cf"},
        "expver": {"layout": "legacy", "expver_dim": True},
    }.items():
        out[name] = write_sample_file(d / f"{name}.nc", grid=GRID, months=MONTHS, seed=SEED, **kw)
    return out


def reference(layout, lon, lat, res=RES):
    """Coarse °C field computed directly from the generator's formula with an explicit per-cell loop."""
    slat, slon = grid_coords(layout, GRID)
    src = sst_celsius(np.arange(MONTHS), slat, slon, SEED).astype(np.float64)
    west, south = lon[0], lat[0]
    width = (lon[1] - lon[0]) % 360 or 360
    H, W = int((lat[1] - lat[0]) / res), int(width / res)
    off = np.mod(slon - west, 360.0)
    out = np.full((MONTHS, H, W), np.nan)
    for i in range(H):
        rows = (slat >= south + i * res) & (slat < south + (i + 1) * res)
        for j in range(W):
            cols = (off >= j * res) & (off < (j + 1) * res)
            block = src[:, rows][:, :, cols]
            w = np.broadcast_to(np.cos(np.deg2rad(slat[rows]))[None, :, None], block.shape)
            ok = np.isfinite(block)
            with np.errstate(invalid="ignore"):
                out[:, i, j] = np.where(ok, block * w, 0).sum((1, 2)) / np.where(ok, w, 0).sum((1, 2))
    out[:, np.isnan(out).any(0)] = np.nan  # land: missing in any month
    return out


def make(path, tmp_path, **kw):
    kw.setdefault("resolution", RES)
    kw.setdefault("split", None)
    return ERA5SSTMonthlyDataset(data_path=path, cache_dir=tmp_path / "cache", **kw)


def cached(ds):
    return np.load(ds.info["cache_path"])


@pytest.mark.parametrize("name", ["legacy", "cds2024", "cf", "expver"])
def test_coarse_values_equal_reference(files, tmp_path, name):
    ds = make(files[name], tmp_path, lon=[-180, 180], lat=[-80, 80])
    assert (ds.height, ds.width) == (32, 72)
    ref = reference("cf" if name == "cf" else "legacy", [-180, 180], [-80, 80])
    got = cached(ds)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    tol = 1e-3 if name in ("legacy", "expver") else 1e-4  # int16 packing step is 6.7e-4 K
    np.testing.assert_allclose(got, ref, atol=tol, equal_nan=True)
    assert (
        ds.info["layout"]
        == {"legacy": "legacy", "cds2024": "cds2024", "cf": "cf-like", "expver": "legacy+expver"}[name]
    )
    np.testing.assert_allclose(ds.lats, -80 + RES * (np.arange(32) + 0.5))


def test_packed_fill_never_leaks(files, tmp_path):
    for name in ("legacy", "expver", "cds2024"):
        got = cached(make(files[name], tmp_path, lon=[0, 360], lat=[-90, 90]))
        finite = got[np.isfinite(got)]
        assert finite.size > 0 and finite.min() >= -5.0 and finite.max() <= 45.0
    # the raw file really holds -32767 fills under the land
    with netCDF4.Dataset(files["legacy"]) as nc:
        nc.set_auto_maskandscale(False)
        assert (nc["sst"][0] == -32767).any()


@pytest.mark.parametrize("name", ["legacy", "cf"])
def test_dateline_area(files, tmp_path, name):
    lon, lat = [170, -120], [-10, 10]
    ds = make(files[name], tmp_path, lon=lon, lat=lat)
    assert (ds.height, ds.width) == (4, 14)
    np.testing.assert_allclose(cached(ds), reference(name, lon, lat), atol=1e-3, equal_nan=True)
    np.testing.assert_allclose(ds.lons[:3], [172.5, 177.5, -177.5])
    assert ds.ocean_mask.all()


def test_land_is_masked_everywhere(files, tmp_path):
    ds = make(files["legacy"], tmp_path, lon=[-180, 180], lat=[-80, 80], split="train")
    mask = ds.ocean_mask.numpy()
    # a cell in the middle of the synthetic Eurasia (80°E, 50°N) is land, mid-Pacific (180°, 0°) is ocean
    i_eu, j_eu = int((50 + 80) / RES), int((80 + 180) / RES)
    assert not mask[i_eu, j_eu] and mask[16, 0]
    assert 0.3 < mask.mean() < 0.95
    x, y = ds[0]
    assert (x[:, ~mask] == 0).all() and (y[~mask] == 0).all()
    xc, yc = ds.sample_c(0)
    assert np.isnan(yc[~mask]).all() and np.isfinite(yc[mask]).all()
    assert np.isnan(ds.climatology_c[:, ~mask]).all()


def test_units_kelvin_heuristic_and_units_on_file(tmp_path):
    ref = None
    for tag, kw in (("none", {"units": None}), ("onfile", {"units_on_file": True}), ("var", {})):
        p = write_sample_file(tmp_path / f"u_{tag}.nc", layout="cds2024", grid=GRID, months=MONTHS, seed=SEED, **kw)
        ds = make(p, tmp_path, lon=[-180, 180], lat=[-60, 60])
        got = cached(ds)
        ref = got if ref is None else ref
        np.testing.assert_allclose(got, ref, equal_nan=True)
        assert np.nanmax(got) < 35
    assert "global attribute" in make(tmp_path / "u_onfile.nc", tmp_path, lon=[0, 360], lat=[-60, 60]).info["units"]


def test_undeclared_fill_values_are_dropped(tmp_path):
    p = write_sample_file(tmp_path / "raw.nc", layout="cf", grid=GRID, months=MONTHS, seed=SEED)
    with netCDF4.Dataset(p, "a") as nc:
        v = nc["sst"]
        v.set_auto_maskandscale(False)
        a = v[:]
        a[np.isnan(a)] = -999.0  # a fill value that nobody declared
        v[:] = a
    ds = make(p, tmp_path, lon=[-180, 180], lat=[-80, 80])
    got = cached(ds)
    assert np.nanmin(got) >= -5.0 and ds.info["implausible_values_masked"] > 0


def test_splits_share_statistics_and_are_ordered(files, tmp_path):
    kw = {"lon": [-180, 180], "lat": [-80, 80], "split_ratio": (0.6, 0.2, 0.2)}
    tr, va, te = (make(files["legacy"], tmp_path, split=s, **kw) for s in ("train", "val", "test"))
    assert len(tr) + len(va) + len(te) == MONTHS - 1
    assert (len(tr), len(va)) == (int(0.6 * 29), int(0.2 * 29))
    for other in (va, te):
        np.testing.assert_array_equal(tr.climatology_c, other.climatology_c, strict=True)
        assert tr.anomaly_std == other.anomaly_std
    assert te.info["cache"] == "hit"
    # climatology uses training months only: months 0..len(tr) (inputs and targets of training samples)
    raw = cached(tr)[: len(tr) + 1]
    cal = np.arange(len(tr) + 1) % 12
    np.testing.assert_allclose(tr.climatology_c[3], raw[cal == 3].mean(0), rtol=1e-5, equal_nan=True)
    two = make(files["legacy"], tmp_path, split="test", lon=[-180, 180], lat=[-80, 80], split_ratio=(0.8, 0.2))
    assert len(two) == 0
    # target of val sample 0 is the month right after the last training target
    np.testing.assert_array_equal(va.sample_c(0)[1], cached(tr)[len(tr) + 1])


@pytest.mark.parametrize("seq_len, offset", [(2, 0), (4, 2)])
def test_getitem_gather_denormalize_agree(files, tmp_path, seq_len, offset):
    ds = make(
        files["cds2024"],
        tmp_path,
        lon=[-180, 180],
        lat=[-80, 80],
        split="val",
        seq_len=seq_len,
        offset=offset,
        split_ratio=(0.5, 0.5),
    )
    arr = cached(ds)
    x, y = ds[2]
    assert x.shape == (seq_len - 1, ds.height, ds.width) and x.dtype == torch.float32
    xc, yc = ds.sample_c(2)
    j = ds._start + 2
    np.testing.assert_array_equal(xc, arr[j : j + seq_len - 1], strict=True)
    np.testing.assert_array_equal(yc, arr[j + seq_len - 1 + offset])
    assert ds.maybe_to_device(torch.device("cpu"))
    gx, gy = ds.gather(torch.tensor([2, 0, 2]))
    assert torch.equal(gx[0], x) and torch.equal(gy[2], y)
    back = ds.denormalize(gy, torch.tensor([2, 0, 2]))
    m = ds.ocean_mask
    torch.testing.assert_close(back[0][m], torch.from_numpy(yc)[m], atol=1e-4, rtol=0)
    assert torch.isnan(back[0][~m]).all()
    assert ds.target_months[2] == (j + seq_len - 1 + offset) % 12  # file starts in January


def test_device_cache_false_keeps_loader_path(files, tmp_path):
    ds = make(files["legacy"], tmp_path, lon=[-180, 180], lat=[-80, 80], device_cache=False)
    assert ds.maybe_to_device(torch.device("cpu")) is False


@pytest.mark.slow
def test_pickles_small_and_works_in_spawned_worker(files, tmp_path):
    ds = make(files["legacy"], tmp_path, lon=[-180, 180], lat=[-80, 80], split="train")
    ds[0]  # opens the memmap
    blob = pickle.dumps(ds)
    assert len(blob) < 4 * ds.climatology_c.nbytes + 100_000  # the (T, H, W) array is never pickled
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    x, y = next(iter(loader))
    assert torch.equal(x[1], ds[1][0]) and torch.equal(y[3], ds[3][1])


def test_cache_hit_never_opens_netcdf(files, tmp_path, monkeypatch):
    first = make(files["legacy"], tmp_path, lon=[-180, 180], lat=[-80, 80])
    assert first.info["cache"] == "miss"

    def boom(*a, **k):
        raise AssertionError("netCDF opened on a cache hit")

    monkeypatch.setattr(netCDF4, "Dataset", boom)
    for mod in (era5_files, era5_grid, era5_cache):
        monkeypatch.setattr(mod, "_open", boom)
    again = make(files["legacy"], tmp_path, lon=[-180, 180], lat=[-80, 80])
    assert again.info["cache"] == "hit"
    assert isinstance(again._array(), np.memmap)


def test_stale_and_corrupt_caches_are_rebuilt(files, tmp_path, caplog):
    p = tmp_path / "src.nc"
    p.write_bytes(files["cf"].read_bytes())
    good = cached(make(p, tmp_path, lon=[-180, 180], lat=[-80, 80]))
    npy = make(p, tmp_path, lon=[-180, 180], lat=[-80, 80]).info["cache_path"]
    with open(npy, "r+b") as f:  # truncate: a crash or a full disk
        f.truncate(os.path.getsize(npy) // 2)
    ds = make(p, tmp_path, lon=[-180, 180], lat=[-80, 80])
    assert ds.info["cache"] == "corrupt" and "corrupt" in caplog.text
    np.testing.assert_array_equal(cached(ds), good)
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the source changed
    ds = make(p, tmp_path, lon=[-180, 180], lat=[-80, 80])
    assert ds.info["cache"] == "stale"
    assert make(p, tmp_path, lon=[-180, 180], lat=[-80, 80]).info["cache"] == "hit"


def test_multiple_files_glob_dir_and_order(tmp_path):
    d = tmp_path / "many"
    d.mkdir()
    for y in (1991, 1990, 1992):  # written out of order: the reader sorts by time
        write_sample_file(d / f"sst_{y}.nc", layout="cds2024", grid=GRID, months=12, seed=SEED, start_year=y)
    by_dir = make(d, tmp_path, lon=[-180, 180], lat=[-80, 80])
    by_glob = make(str(d / "sst_*.nc"), tmp_path, lon=[-180, 180], lat=[-80, 80])
    assert by_dir.info["months"].startswith("1990-01..1992-12")
    np.testing.assert_array_equal(cached(by_dir), cached(by_glob))
    # a missing year is a gap error naming the file and the months
    (d / "sst_1991.nc").unlink()
    with pytest.raises(ValueError, match=r"sst_1992\.nc.*gap: 1991-01\.\.1991-12"):
        make(d, tmp_path, lon=[-180, 180], lat=[-80, 80])
    write_sample_file(d / "dup.nc", layout="cds2024", grid=GRID, months=3, seed=SEED, start_year=1990)
    with pytest.raises(ValueError, match="duplicated month 1990-01"):
        make(d, tmp_path, lon=[-180, 180], lat=[-80, 80])


@pytest.mark.slow
def test_default_path_env_and_builtin_sample(files, tmp_path, monkeypatch):
    monkeypatch.setenv("ERA5_DATA_PATH", str(files["cf"]))
    ds = ERA5SSTMonthlyDataset(resolution=RES, cache_dir=tmp_path / "c")
    assert ds.info["source_files"] == [str(files["cf"])] and not ds.info["builtin_sample"]
    monkeypatch.delenv("ERA5_DATA_PATH")
    seed = ERA5SSTMonthlyDataset(
        lon=[-180, 180], lat=[-80, 80], seq_len=2, offset=0, resolution=2, cache_dir=tmp_path / "c"
    )  # the seed's quick start: no path at all
    assert seed.info["builtin_sample"] and (seed.height, seed.width) == (80, 180)
    with netCDF4.Dataset(seed.info["source_files"][0]) as nc:
        assert nc.synthetic == "true"


# ---- bad input: clear errors naming the file and the problem ------------------------------------------------
def test_missing_file(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="data_path .*nope.nc.*pass data_path=.*ERA5_DATA_PATH"):
        make(tmp_path / "nope.nc", tmp_path, lon=[-180, 180], lat=[-80, 80])
    monkeypatch.setenv("ERA5_DATA_PATH", str(tmp_path / "gone.nc"))  # a path from the environment says so
    with pytest.raises(FileNotFoundError, match=r"^\$ERA5_DATA_PATH .*gone.nc.*set \$ERA5_DATA_PATH"):
        ERA5SSTMonthlyDataset(resolution=RES, cache_dir=tmp_path / "c")


def test_no_sst_variable_lists_variables(tmp_path):
    p = tmp_path / "t2m.nc"
    with netCDF4.Dataset(p, "w") as nc:
        for d, n in (("time", 2), ("latitude", 3), ("longitude", 4)):
            nc.createDimension(d, n)
        nc.createVariable("t2m", "f4", ("time", "latitude", "longitude"))
    with pytest.raises(ValueError, match=r"t2m\.nc.*no SST-like variable.*\['t2m'\]"):
        make(p, tmp_path, lon=[-180, 180], lat=[-80, 80])


def test_area_outside_or_beyond_the_data(tmp_path):
    p = tmp_path / "tropics.nc"
    lat = np.arange(-20.0, 20.1, GRID)
    with netCDF4.Dataset(p, "w") as nc:
        nc.createDimension("time", 3)
        nc.createDimension("lat", lat.size)
        nc.createDimension("lon", 144)
        t = nc.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01"
        t[:] = [0, 31, 60]
        nc.createVariable("lat", "f4", ("lat",))[:] = lat
        nc.createVariable("lon", "f4", ("lon",))[:] = np.arange(144) * GRID
        v = nc.createVariable("sst", "f4", ("time", "lat", "lon"))
        v.units = "degC"
        v[:] = 25.0
    with pytest.raises(ValueError, match=r"lies outside the data of .*tropics\.nc"):
        make(p, tmp_path, lon=[0, 360], lat=[30, 50])
    with pytest.raises(ValueError, match=r"extends beyond the data of .*tropics\.nc"):
        make(p, tmp_path, lon=[0, 360], lat=[-30, 10])
    ok = make(p, tmp_path, lon=[0, 360], lat=[-20, 20], seq_len=2)
    assert len(ok) == 2 and float(cached(ok).mean()) == pytest.approx(25.0)


def test_resolution_finer_than_data(files, tmp_path):
    with pytest.raises(ValueError, match=r"resolution=1\.0° is finer than the data grid \(2\.5°.*legacy\.nc"):
        make(files["legacy"], tmp_path, lon=[-180, 180], lat=[-80, 80], resolution=1.0)


def test_fewer_months_than_seq_len(tmp_path):
    p = write_sample_file(tmp_path / "short.nc", grid=GRID, months=3, seed=SEED)
    with pytest.raises(ValueError, match=r"short\.nc.*3 months is fewer than seq_len"):
        make(p, tmp_path, lon=[-180, 180], lat=[-80, 80], seq_len=4)


@pytest.mark.parametrize("layout", ["legacy", "cds2024"])
def test_corrupt_file(files, tmp_path, layout):
    """The right magic bytes but half the file: corrupt or truncated."""
    p = tmp_path / "truncated.nc"
    data = files[layout].read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"truncated\.nc.*(corrupt|truncated)"):
        make(p, tmp_path, lon=[-180, 180], lat=[-80, 80])


@pytest.mark.parametrize(
    "content, match",
    [
        (b"this is not netCDF\n" * 100, r"not a netCDF file: it starts with b'this is not netC', a text file"),
        (bytes(range(256)) * 4, "not a netCDF file: .*another format"),
        (b"", r"empty \(0 bytes\)"),
    ],
)
def test_not_netcdf_file_says_so(tmp_path, content, match):
    """A file without netCDF's magic bytes (b'CDF', b'\\x89HDF') is called that, not corrupt."""
    p = tmp_path / "notes.nc"
    p.write_bytes(content)
    with pytest.raises(ValueError, match=match) as e:
        make(p, tmp_path, lon=[-180, 180], lat=[-80, 80])
    assert "notes.nc" in str(e.value) and "corrupt" not in str(e.value)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"seq_len": 1}, "seq_len"),
        ({"split": "dev"}, "split"),
        ({"split_ratio": (0.9, 0.2)}, "split_ratio"),
        ({"offset": -1}, "offset"),
    ],
)
def test_bad_arguments(files, tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        make(files["legacy"], tmp_path, lon=[-180, 180], lat=[-80, 80], **kw)


# ---- the sample generator ----------------------------------------------------------------------------------
def test_sample_is_deterministic_chunk_independent_and_labelled(tmp_path, capsys):
    a = write_sample_file(tmp_path / "a.nc", grid=5.0, months=14, seed=7, chunk_months=12)
    b = write_sample_file(tmp_path / "b.nc", grid=5.0, months=14, seed=7, chunk_months=5)
    with netCDF4.Dataset(a) as na, netCDF4.Dataset(b) as nb:
        np.testing.assert_array_equal(na["sst"][:], nb["sst"][:])
        assert na.synthetic == "true" and "NOT real data" in na.title
        assert na["latitude"][0] == 90 and na["longitude"][-1] == 355
    main([str(tmp_path / "c.nc"), "--layout", "cds2024", "--years", "1", "--grid", "5"])
    assert "wrote" in capsys.readouterr().out
    with netCDF4.Dataset(tmp_path / "c.nc") as nc:
        assert {"valid_time", "expver", "number"} <= set(nc.variables) and nc["sst"].dtype == np.float32


def test_orphan_temp_files_of_a_killed_build_are_removed(files, tmp_path):
    import subprocess
    import sys

    cache = tmp_path / "cache"
    cache.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is gone now (the OS may reuse it only much later)
    old = time.time() - 600
    orphan = cache / f".era5_0123abcd.npy.{dead.pid}.tmp.npy"
    orphan_json = cache / f".era5_0123abcd.json.{dead.pid}.tmp"
    fresh = cache / f".era5_4567.npy.{dead.pid}.tmp.npy"  # writer gone, but inside the grace period
    live = cache / f".era5_89ab.npy.{os.getpid()}.tmp.npy"  # a live writer: never touched
    stale = cache / f".era5_cdef.npy.{os.getpid()}.tmp.npy"  # "live" pid, untouched for 2 h: a reused pid
    other = cache / "notes.1234.tmp"  # not ours
    for p in (orphan, orphan_json, fresh, live, stale, other):
        p.write_bytes(b"x" * 10)
    for p in (orphan, orphan_json, live, other):
        os.utime(p, (old, old))
    os.utime(stale, (time.time() - 7200,) * 2)
    ds = make(files["cf"], tmp_path, lon=[-180, 180], lat=[-80, 80])  # the next start cleans up
    assert ds.info["cache"] == "miss"
    assert not orphan.exists() and not orphan_json.exists() and not stale.exists()
    assert fresh.exists() and live.exists() and other.exists()
    assert era5_cache.remove_orphan_temp_files(cache) == []


def test_sample_anomalies_are_red_and_persistence_is_strong(tmp_path):
    """Issue 13: monthly anomalies with realistic month-to-month persistence (lag-1 autocorrelation 0.6-0.9),
    so anomaly persistence clearly beats climatology, as on real SST."""
    p = write_sample_file(tmp_path / "red.nc", layout="cf", years=12, grid=5.0)
    ds = make(p, tmp_path, lon=[120, 290], lat=[-20, 20], split="train", split_ratio=(0.9, 0.1))
    a = ds.train_anomalies_c()[:, ds.ocean_mask.numpy()]
    a = a - a.mean(0)
    r1 = np.sum(a[:-1] * a[1:], 0) / np.sqrt(np.sum(a[:-1] ** 2, 0) * np.sum(a[1:] ** 2, 0))
    assert 0.6 <= np.median(r1) <= 0.9
    assert 0.2 < np.median(a.std(0)) < 1.0  # °C: anomalies of a realistic size
    # anomaly persistence's error is well below climatology's (the anomaly std)
    assert np.sqrt(np.mean((a[1:] - a[:-1]) ** 2)) < 0.8 * np.sqrt(np.mean(a**2))
