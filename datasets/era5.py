"""ERA5 monthly SST forecasting data: netCDF -> coarse °C cache (.npy, memory-mapped) -> normalised samples.

    ds = ERA5SSTMonthlyDataset(lon=[-180, 180], lat=[-80, 80], seq_len=2, offset=0, resolution=2, split="train")
    x, y = ds[0]      # x: (seq_len-1, H, W) previous months, y: (H, W) the target month; normalised, land = 0

What happens once, on first use (later runs only memory-map the cache and never open netCDF):
1. `data_path` (file, list, glob or directory; default $ERA5_DATA_PATH, else the built-in synthetic sample
   from `datasets.era5_sample`) is scanned: SST variable, time/lat/lon names, units, month order.
2. Each file is read in time chunks (masked values -> NaN, K -> °C, implausible values outside [-5, 45] °C
   -> NaN, ERA5T `expver` merged), subset to the area (wrapping longitudes) and coarsened to `resolution`
   degrees by a cos-latitude weighted mean over the finite source points of each cell (never striding).
3. Cells missing at any month are land: NaN at every month, a fixed `ocean_mask`.
4. The (T, H, W) float32 °C array is written atomically to `<cache_dir>/era5_<hash>.npy` with a JSON sidecar
   whose key hashes the source files (path, size, mtime), area, resolution and variable. A stale or corrupt
   cache is rebuilt with one log line.

Samples follow the seed: sample i has x = months [i, i + seq_len - 1) (the previous `seq_len - 1` months) and
y = month i + seq_len - 1 + offset. Splits are contiguous in time (train, val, test) by fractions of samples.
Normalisation: subtract the per-cell calendar-month climatology of the training months and divide by one
global anomaly std of the training months, so the model learns anomalies; every split computes the same
statistics from the same cached array. Coarse grids keep the area's orientation: `lats` ascend (row 0 is the
southern edge), `lons` go eastward from the west edge.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import netCDF4
import numpy as np
import torch
from torch.utils.data import Dataset

from datasets.area import Area

log = logging.getLogger(__name__)

CACHE_VERSION = 1
SST_NAMES = ("sst", "SST", "analysed_sst", "tos", "sea_surface_temperature", "sst_mean")
SST_STANDARD_NAMES = ("sea_surface_temperature", "sea_surface_foundation_temperature")
TIME_NAMES = ("time", "valid_time", "t")
LAT_NAMES = ("latitude", "lat", "nav_lat", "y")
LON_NAMES = ("longitude", "lon", "nav_lon", "x")
KELVIN_UNITS = {"k", "kelvin", "degk", "deg_k", "degreek", "degree_k", "degrees_k", "degreesk"}
CELSIUS_UNITS = {
    "c",
    "degc",
    "deg_c",
    "degreec",
    "degree_c",
    "degrees_c",
    "degreesc",
    "celsius",
    "degree_celsius",
    "degrees_celsius",
    "degreescelsius",
}
PLAUSIBLE_C = (-5.0, 45.0)  # sea water: anything outside is a fill value or a unit error, never data
CHUNK_BYTES = 64 * 2**20  # bytes of raw float32 per read: bounds RAM for native 0.25° files


def _month_str(m: int) -> str:
    return f"{m // 12:04d}-{m % 12 + 1:02d}"


def default_cache_dir() -> Path:
    """$PLAINLOOP_CACHE, else ~/.cache/plainloop."""
    return Path(os.environ.get("PLAINLOOP_CACHE") or Path.home() / ".cache" / "plainloop")


def resolve_files(data_path: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Expand a file, a glob, a directory (its *.nc files) or a list of those into existing file paths."""
    if isinstance(data_path, (list, tuple)):
        out: list[Path] = []
        for p in data_path:
            out.extend(resolve_files(p))
        if not out:
            raise FileNotFoundError("data_path is an empty list: give at least one netCDF file")
        return out
    text = os.fspath(data_path)
    p = Path(text).expanduser()
    if p.is_dir():
        files = sorted(
            q for q in p.iterdir() if q.suffix.lower() in (".nc", ".nc4", ".netcdf") and q.is_file()
        )
        if not files:
            raise FileNotFoundError(f"data_path directory {p} holds no .nc files")
        return files
    if p.is_file():  # before globbing: a real file name may contain [ or ?
        return [p]
    if any(c in text for c in "*?["):
        files = sorted(Path(q) for q in globlib.glob(os.path.expanduser(text)))
        if not files:
            raise FileNotFoundError(f"data_path glob {text!r} matches no file")
        return files
    if not p.is_file():
        raise FileNotFoundError(
            f"ERA5 data file not found: {p}. Pass data_path= (file, list, glob or directory) or set $ERA5_DATA_PATH"
        )
    return [p]


def _open(path: Path) -> netCDF4.Dataset:
    try:
        return netCDF4.Dataset(path, "r")
    except (OSError, RuntimeError, ValueError) as e:
        raise ValueError(
            f"{path}: cannot be read as netCDF ({e}); the file is corrupt or truncated, fetch it again"
        ) from e


def _units_kind(units: str | None) -> str | None:
    """'K', 'C', None (no units) or 'unknown'."""
    if units is None:
        return None
    u = str(units).strip().lower().replace(" ", "").replace("°", "")
    if u in KELVIN_UNITS:
        return "K"
    if u in CELSIUS_UNITS:
        return "C"
    return "unknown"


@dataclass
class FileEntry:
    """What a scan learns about one netCDF file, enough to read it without guessing again."""

    path: Path
    var: str
    time_name: str
    lat_name: str
    lon_name: str
    months: np.ndarray  # year * 12 + month - 1 of each time step
    lat: np.ndarray
    lon: np.ndarray
    dims: tuple[str, ...]
    units: str | None  # "K", "C" or None (decided from the values)
    units_note: str
    layout: str
    expver_axis: int | None = None

    @property
    def first(self) -> int:
        return int(self.months[0])

    @property
    def last(self) -> int:
        return int(self.months[-1])


def scan_file(path: Path, variable: str = "sst") -> FileEntry:
    """Open a file once and find its SST variable, coordinates, months and units, or say clearly what is wrong."""
    with _open(path) as nc:
        names = list(nc.variables)
        if nc.file_format.startswith("NETCDF3"):  # uncompressed: a short file is truncated, and netCDF-C
            need = sum(v.size * v.dtype.itemsize for v in nc.variables.values())  # would read zeros past EOF
            have = path.stat().st_size
            if have < need:
                raise ValueError(
                    f"{path}: the file is truncated or corrupt ({have} bytes, its header describes "
                    f"at least {need}); fetch it again"
                )
        if variable in nc.variables:
            var = variable
        elif variable == "sst":  # the default: accept any well-known SST name
            cands = [n for n in names if n in SST_NAMES and nc.variables[n].ndim >= 3]
            cands += [
                n
                for n in names
                if getattr(nc.variables[n], "standard_name", "") in SST_STANDARD_NAMES
                and nc.variables[n].ndim >= 3
                and n not in cands
            ]
            if not cands:
                raise ValueError(
                    f"{path}: no SST-like variable (looked for {SST_NAMES}); variables found: {names}. "
                    "Pass variable=NAME"
                )
            var = cands[0]
        else:
            raise ValueError(
                f"{path}: no variable {variable!r}; variables found: {names}. Pass variable=NAME"
            )
        v = nc.variables[var]
        dims = tuple(v.dimensions)

        def pick(cands: tuple[str, ...], what: str) -> str:
            for n in cands:
                if n in dims and n in nc.variables:
                    return n
            for n in dims:  # fall back on CF attributes
                cv = nc.variables.get(n)
                if cv is None:
                    continue
                units = str(getattr(cv, "units", "")).lower()
                if what == "time" and " since " in units:
                    return n
                if what == "latitude" and units.startswith("degree") and units.endswith(("n", "north")):
                    return n
                if what == "longitude" and units.startswith("degree") and units.endswith(("e", "east")):
                    return n
            raise ValueError(
                f"{path}: variable {var!r} has dims {dims}; found no {what} coordinate among them"
            )

        tname, latname, lonname = (
            pick(TIME_NAMES, "time"),
            pick(LAT_NAMES, "latitude"),
            pick(LON_NAMES, "longitude"),
        )
        if dims[0] != tname or dims[-2:] != (latname, lonname):
            raise ValueError(
                f"{path}: {var!r} has dims {dims}; expected ({tname}, [expver,] {latname}, {lonname})"
            )
        expver_axis = None
        for i, d in enumerate(dims[1:-2], start=1):
            if d == "expver":
                expver_axis = i
            elif len(nc.dimensions[d]) != 1:
                raise ValueError(
                    f"{path}: {var!r} has an extra dimension {d!r} of size {len(nc.dimensions[d])}; "
                    "only time, expver, lat, lon (and size-1 levels) are supported"
                )
        tv = nc.variables[tname]
        try:
            t_units = tv.units
        except AttributeError as e:
            raise ValueError(f"{path}: time variable {tname!r} has no units attribute") from e
        try:
            dates = netCDF4.num2date(
                tv[:], t_units, getattr(tv, "calendar", "standard"), only_use_cftime_datetimes=True
            )
            months = np.array([d.year * 12 + d.month - 1 for d in np.atleast_1d(dates)], dtype=np.int64)
        except (OSError, RuntimeError, ValueError) as e:
            raise ValueError(f"{path}: cannot decode time variable {tname!r} ({e})") from e
        if months.size == 0:
            raise ValueError(f"{path}: no time steps")
        d = np.diff(months)
        bad = np.flatnonzero(d != 1)
        if bad.size:
            k = int(bad[0])
            a, b = int(months[k]), int(months[k + 1])
            what = (
                f"duplicated month {_month_str(b)}"
                if b == a
                else f"months out of order at {_month_str(b)} (after {_month_str(a)})"
                if b < a
                else f"gap: {_month_str(a + 1)}..{_month_str(b - 1)} missing (jumps from {_month_str(a)} to {_month_str(b)})"
            )
            raise ValueError(f"{path}: {what}; monthly data must be consecutive months")
        try:
            lat = np.asarray(nc.variables[latname][:], dtype=np.float64)
            lon = np.asarray(nc.variables[lonname][:], dtype=np.float64)
        except (OSError, RuntimeError) as e:
            raise ValueError(
                f"{path}: cannot read coordinates ({e}); the file is corrupt or truncated"
            ) from e
        if lat.ndim != 1 or lon.ndim != 1:
            raise ValueError(
                f"{path}: only regular 1-D lat/lon grids are supported (got {lat.shape}, {lon.shape})"
            )
        units = getattr(v, "units", None)
        note = "variable attribute"
        if units is None and hasattr(nc, "units"):
            units, note = nc.units, "global attribute"
        kind = _units_kind(units)
        if kind == "unknown":
            raise ValueError(f"{path}: {var!r} has units {units!r}; expected K or °C (degC)")
        units_note = f"{units} ({note})" if units is not None else "none: decided from the values"
        is_packed = v.dtype == np.int16 and hasattr(v, "scale_factor")
        if tname == "valid_time":
            layout = "cds2024"
        elif latname == "latitude" and is_packed:
            layout = "legacy+expver" if expver_axis is not None else "legacy"
        else:
            layout = "cf-like"
        return FileEntry(
            path, var, tname, latname, lonname, months, lat, lon, dims, kind, units_note, layout, expver_axis
        )


@dataclass
class CoarsenPlan:
    """Which source rows/columns feed which coarse cell: contiguous groups for np.add.reduceat."""

    height: int
    width: int
    lat_read: slice  # contiguous source latitude range to read
    lon_read: slice  # contiguous source longitude range to read (may be the full circle)
    lat_take: np.ndarray  # indices into the read block, sorted by coarse row
    lon_take: np.ndarray
    lat_starts: np.ndarray  # reduceat group starts
    lon_starts: np.ndarray
    lat_weight: np.ndarray  # cos(lat) of each taken row
    lats: np.ndarray  # coarse cell centres
    lons: np.ndarray
    source_grid: tuple[float, float] = field(default=(0.0, 0.0))


def make_plan(lat: np.ndarray, lon: np.ndarray, area: Area, resolution: float, where: str) -> CoarsenPlan:
    """Assign each source point to the coarse cell [edge, edge + resolution) holding it (half-open, so points
    on a shared edge count once) and check that the area lies inside the data."""
    dlat = float(np.min(np.abs(np.diff(lat)))) if lat.size > 1 else 180.0
    lon_sorted = np.unique(np.mod(lon, 360.0))
    dlon = float(np.min(np.diff(lon_sorted))) if lon_sorted.size > 1 else 360.0
    if resolution < max(dlat, dlon) - 1e-6:
        raise ValueError(
            f"resolution={resolution}° is finer than the data grid ({dlat:g}° lat x {dlon:g}° lon) of "
            f"{where}; coarsening cannot invent detail: use resolution >= {max(dlat, dlon):g}"
        )
    height = int(area.height / resolution + 1e-6)  # the seed's int(area.height / resolution)
    width = int(area.width / resolution + 1e-6)
    if height < 1 or width < 1:
        raise ValueError(f"area {area} is smaller than one {resolution}° cell")
    south = area.lat[0]
    row = np.floor((lat - south) / resolution + 1e-9).astype(np.int64)
    col = np.floor(area.lon_offset(lon) / resolution + 1e-9).astype(np.int64)
    in_lat = (row >= 0) & (row < height)
    in_lon = (col >= 0) & (col < width)
    rows_hit = np.bincount(row[in_lat], minlength=height)[:height]
    cols_hit = np.bincount(col[in_lon], minlength=width)[:width]
    data_desc = (
        f"data covers lat {lat.min():g}..{lat.max():g}, lon {lon.min():g}..{lon.max():g} "
        f"({dlat:g}° x {dlon:g}° grid)"
    )
    if not rows_hit.any() or not cols_hit.any():
        raise ValueError(
            f"area {area.title!r} lon={area.lon} lat={area.lat} lies outside the data of {where}: {data_desc}"
        )
    if (rows_hit == 0).any() or (cols_hit == 0).any():
        raise ValueError(
            f"area {area.title!r} lon={area.lon} lat={area.lat} extends beyond the data of {where}: "
            f"{data_desc}; shrink the area or use a larger data set"
        )
    lat_idx = np.flatnonzero(in_lat)
    lon_idx = np.flatnonzero(in_lon)
    lat_read = slice(int(lat_idx.min()), int(lat_idx.max()) + 1)
    contiguous = lon_idx.max() - lon_idx.min() + 1 == lon_idx.size
    lon_read = slice(int(lon_idx.min()), int(lon_idx.max()) + 1) if contiguous else slice(0, lon.size)
    lat_order = lat_idx[np.argsort(row[lat_idx], kind="stable")]
    lon_order = lon_idx[np.argsort(col[lon_idx], kind="stable")]
    lat_starts = np.concatenate([[0], np.cumsum(rows_hit)[:-1]])
    lon_starts = np.concatenate([[0], np.cumsum(cols_hit)[:-1]])
    lats = south + resolution * (np.arange(height) + 0.5)
    lons = area.lon[0] + resolution * (np.arange(width) + 0.5)
    if max(area.lon) <= 180.0:  # keep the area's own longitude convention
        lons = (lons + 180.0) % 360.0 - 180.0
    else:
        lons = lons % 360.0
    return CoarsenPlan(
        height,
        width,
        lat_read,
        lon_read,
        lat_order - lat_read.start,
        lon_order - lon_read.start,
        lat_starts,
        lon_starts,
        np.cos(np.deg2rad(lat[lat_order])),
        lats,
        lons,
        (dlat, dlon),
    )


def coarsen(block: np.ndarray, plan: CoarsenPlan) -> np.ndarray:
    """(t, lat_read, lon_read) °C with NaN -> (t, H, W) cos-latitude weighted mean over finite points."""
    sub = block[:, plan.lat_take][:, :, plan.lon_take]
    ok = np.isfinite(sub)
    w = plan.lat_weight[None, :, None]
    num = np.add.reduceat(np.where(ok, sub, 0.0) * w, plan.lat_starts, axis=1)
    num = np.add.reduceat(num, plan.lon_starts, axis=2)
    den = np.add.reduceat(ok * w, plan.lat_starts, axis=1)
    den = np.add.reduceat(den, plan.lon_starts, axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan).astype(np.float32)


class NetCDFSource:
    """One or more monthly files on one grid, read in time order and coarsened to an area's cells."""

    def __init__(self, files: Sequence[Path], area: Area, resolution: float, variable: str = "sst") -> None:
        entries = sorted((scan_file(Path(f), variable) for f in files), key=lambda e: e.first)
        for prev, cur in zip(entries, entries[1:]):
            if cur.first <= prev.last:
                raise ValueError(
                    f"{cur.path}: duplicated month {_month_str(cur.first)} (also in {prev.path})"
                )
            if cur.first != prev.last + 1:
                raise ValueError(
                    f"{cur.path}: gap: {_month_str(prev.last + 1)}..{_month_str(cur.first - 1)} missing "
                    f"between {prev.path.name} and {cur.path.name}"
                )
            if cur.lat.shape != entries[0].lat.shape or not (
                np.allclose(cur.lat, entries[0].lat) and np.allclose(cur.lon, entries[0].lon)
            ):
                raise ValueError(
                    f"{cur.path}: its lat/lon grid differs from {entries[0].path}; regrid the files to one grid"
                )
        self.entries = entries
        self.area, self.resolution = area, resolution
        first = entries[0]
        self.plan = make_plan(first.lat, first.lon, area, resolution, str(first.path))
        self.months = np.concatenate([e.months for e in entries])
        self.implausible = 0  # count of source values outside PLAUSIBLE_C that were dropped
        self._kelvin_guess: dict[Path, bool] = {}

    @property
    def layouts(self) -> list[str]:
        return sorted({e.layout for e in self.entries})

    def read_raw(self, entry: FileEntry, t0: int, t1: int, nc: netCDF4.Dataset | None = None) -> np.ndarray:
        """Months [t0, t1) of one file as (t, lat_read, lon_read) float32 °C, NaN where missing."""
        p = self.plan
        idx: list[object] = [slice(t0, t1)]
        for i in range(1, len(entry.dims) - 2):
            idx.append(slice(None) if i == entry.expver_axis else 0)
        idx += [p.lat_read, p.lon_read]
        own = nc is None
        nc = _open(entry.path) if own else nc
        try:
            # netCDF4 applies scale/offset and masks _FillValue/missing_value; filled(NaN) keeps fills out
            a = np.ma.filled(nc.variables[entry.var][tuple(idx)].astype(np.float32), np.nan)
        except (OSError, RuntimeError, IndexError) as e:
            raise ValueError(
                f"{entry.path}: cannot read {entry.var!r} months {t0}..{t1} ({e}); "
                "the file is corrupt or truncated, fetch it again"
            ) from e
        finally:
            if own:
                nc.close()
        if entry.expver_axis is not None:  # ERA5T: the last expver present wins, earlier ones fill the gaps
            # size-1 level dims were indexed away, so expver is axis 1 of (t, expver, lat, lon)
            merged = a[:, -1]
            for e in range(a.shape[1] - 2, -1, -1):
                merged = np.where(np.isfinite(merged), merged, a[:, e])
            a = merged
        kelvin = entry.units == "K"
        if entry.units is None:  # no units anywhere: ocean SST above 100 can only be Kelvin
            if entry.path not in self._kelvin_guess:
                self._kelvin_guess[entry.path] = (
                    bool(np.nanmedian(a) > 100.0) if np.isfinite(a).any() else False
                )
            kelvin = self._kelvin_guess[entry.path]
        elif entry.units == "C" and np.isfinite(a).any() and np.nanmedian(a) > 100.0:
            raise ValueError(
                f"{entry.path}: units say °C ({entry.units_note}) but the values look like Kelvin "
                f"(median {np.nanmedian(a):.1f}); fix the units attribute"
            )
        if kelvin:
            a -= np.float32(273.15)
        bad = (a < PLAUSIBLE_C[0]) | (a > PLAUSIBLE_C[1])
        n_bad = int(bad.sum())
        if n_bad:  # an undeclared fill value or a unit slip: never let it into the means
            self.implausible += n_bad
            a[bad] = np.nan
        return a

    def read_months(self, g0: int, g1: int) -> np.ndarray:
        """Global months [g0, g1) (0 = first month of the first file) coarsened: (t, H, W) float32 °C."""
        out = []
        base = 0
        for e in self.entries:
            n = e.months.size
            lo, hi = max(g0, base), min(g1, base + n)
            if lo < hi:
                out.append(coarsen(self.read_raw(e, lo - base, hi - base), self.plan))
            base += n
        return np.concatenate(out, axis=0)

    def chunk_months(self) -> int:
        p = self.plan
        per_month = (p.lat_read.stop - p.lat_read.start) * (p.lon_read.stop - p.lon_read.start) * 4
        return max(1, CHUNK_BYTES // max(per_month, 1))


def _cache_key(files: Sequence[Path], area: Area, resolution: float, variable: str) -> tuple[str, str]:
    """(name, key): the name fixes which cache file; the key also covers size and mtime, so an edited source
    makes the cache stale instead of silently reused."""
    ident = {
        "v": CACHE_VERSION,
        "files": [str(Path(f).resolve()) for f in files],
        "lon": area.lon,
        "lat": area.lat,
        "res": float(resolution),
        "var": variable,
    }
    name = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]
    stats = [(os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    key = hashlib.sha256(json.dumps([ident, stats], sort_keys=True).encode()).hexdigest()
    return name, key


def _load_cache(npy: Path, meta_path: Path, key: str) -> tuple[dict | None, str]:
    if not npy.exists() or not meta_path.exists():
        return None, "miss"
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("key") != key:
            log.warning("ERA5 cache %s is stale (source files, area or resolution changed): rebuilding", npy)
            return None, "stale"
        arr = np.load(npy, mmap_mode="r")
        if (
            arr.dtype != np.float32
            or list(arr.shape) != meta["shape"]
            or npy.stat().st_size != meta["nbytes_file"]
        ):
            raise ValueError(f"shape/dtype/size {arr.shape} {arr.dtype} do not match the sidecar")
        del arr
        return meta, "hit"
    except Exception as e:  # noqa: BLE001 - anything unreadable is rebuilt, never trusted
        log.warning("ERA5 cache %s is corrupt (%s): rebuilding", npy, e)
        return None, "corrupt"


def build_cache(source: NetCDFSource, npy: Path, meta_path: Path, key: str) -> dict:
    """Read every month once, coarsen, mask land, write (T, H, W) float32 atomically; return the sidecar."""
    p = source.plan
    T = int(source.months.size)
    tmp = npy.with_name(f".{npy.name}.{os.getpid()}.tmp.npy")
    any_nan = np.zeros((p.height, p.width), dtype=bool)
    try:
        mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(T, p.height, p.width))
        step = source.chunk_months()
        g = 0
        for e in source.entries:
            with _open(e.path) as nc:
                for t0 in range(0, e.months.size, step):
                    t1 = min(e.months.size, t0 + step)
                    c = coarsen(source.read_raw(e, t0, t1, nc), p)
                    mm[g + t0 : g + t1] = c
                    any_nan |= np.isnan(c).any(axis=0)
            g += e.months.size
        if any_nan.all():
            raise ValueError(
                f"{[str(e.path) for e in source.entries]}: no ocean cell in area {source.area}: "
                "every coarse cell is missing in some month"
            )
        for t0 in range(0, T, 256):  # land: missing at any month -> missing at every month
            mm[t0 : t0 + 256, any_nan] = np.nan
        mm.flush()
        del mm
        os.replace(tmp, npy)
    finally:
        tmp.unlink(missing_ok=True)
    meta = {
        "key": key,
        "version": CACHE_VERSION,
        "shape": [T, p.height, p.width],
        "nbytes_file": npy.stat().st_size,
        "months": source.months.tolist(),
        "lats": p.lats.tolist(),
        "lons": p.lons.tolist(),
        "files": [str(e.path) for e in source.entries],
        "layout": ",".join(source.layouts),
        "variable": source.entries[0].var,
        "units": source.entries[0].units_note,
        "source_grid_deg": list(p.source_grid),
        "implausible_values_masked": source.implausible,
        "area": {"title": source.area.title, "lon": source.area.lon, "lat": source.area.lat},
        "resolution": source.resolution,
    }
    tmpj = meta_path.with_name(f".{meta_path.name}.{os.getpid()}.tmp")
    tmpj.write_text(json.dumps(meta))
    os.replace(tmpj, meta_path)  # the sidecar is written last: it marks the cache complete
    return meta


def _split_counts(n: int, split_ratio: Sequence[float]) -> tuple[int, int, int]:
    r = [float(x) for x in split_ratio]
    if len(r) not in (2, 3) or any(x < 0 for x in r) or sum(r) > 1 + 1e-6 or r[0] <= 0:
        raise ValueError(
            f"split_ratio={tuple(split_ratio)}: give (train, val[, test]) fractions >= 0 summing to <= 1"
        )
    n_train = int(n * r[0] + 1e-9)
    if n_train < 1:
        raise ValueError(f"split_ratio={tuple(split_ratio)} leaves no training sample out of {n}")
    if len(r) == 2:
        return n_train, n - n_train, 0
    n_val = min(int(n * r[1] + 1e-9), n - n_train)
    return n_train, n_val, n - n_train - n_val


class ERA5SSTMonthlyDataset(Dataset):
    """ERA5 (or any CF) monthly SST over an area, coarsened, cached and normalised. See the module docstring.

    x: float32 (seq_len - 1, H, W), y: float32 (H, W); normalised anomalies, land = 0.
    """

    SPLITS = ("train", "val", "test", None)

    def __init__(
        self,
        lon: Sequence[float] = (-180, 180),
        lat: Sequence[float] = (-80, 80),
        seq_len: int = 2,
        offset: int = 0,
        resolution: float = 2,
        data_path: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
        variable: str = "sst",
        split: str | None = "train",
        split_ratio: Sequence[float] = (0.8, 0.1, 0.1),
        device_cache: bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        area: Area | None = None,
    ) -> None:
        if split not in self.SPLITS:
            raise ValueError(f"split={split!r}: use 'train', 'val', 'test' or None (all samples)")
        if int(seq_len) != seq_len or seq_len < 2:
            raise ValueError(
                f"seq_len={seq_len}: must be an integer >= 2 (x holds the previous seq_len - 1 months)"
            )
        if int(offset) != offset or offset < 0:
            raise ValueError(
                f"offset={offset}: must be an integer >= 0 (extra months between input and target)"
            )
        if not resolution or resolution <= 0:
            raise ValueError(f"resolution={resolution}: must be > 0 degrees")
        self.area = area if area is not None else Area("area", lon=list(lon), lat=list(lat))
        self.seq_len, self.offset, self.resolution = int(seq_len), int(offset), float(resolution)
        self.split, self.device_cache = split, device_cache
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        if data_path is None:
            data_path = os.environ.get("ERA5_DATA_PATH") or None
        sample = data_path is None
        if sample:  # the seed's quick start passes no path: use the built-in synthetic sample
            from datasets.era5_sample import ensure_sample_file

            data_path = ensure_sample_file(cache)
        files = resolve_files(data_path)

        name, key = _cache_key(files, self.area, self.resolution, variable)
        self._npy = cache / f"era5_{name}.npy"
        meta_path = cache / f"era5_{name}.json"
        meta, status = _load_cache(self._npy, meta_path, key)
        if meta is None:
            source = NetCDFSource(files, self.area, self.resolution, variable)
            log.info("ERA5 cache %s: building from %d file(s) (%s)", self._npy, len(files), status)
            meta = build_cache(source, self._npy, meta_path, key)
        T, H, W = meta["shape"]
        self.height, self.width = H, W
        self.months = np.asarray(meta["months"], dtype=np.int64)
        self.lats = np.asarray(meta["lats"])  # ascending: row 0 is the southern edge
        self.lons = np.asarray(meta["lons"])  # eastward from the west edge, in the area's convention
        self._mm: np.ndarray | None = None
        mm = self._array()
        self.ocean_mask = torch.from_numpy(np.isfinite(np.asarray(mm[0])))

        # samples and splits, in time order
        span = self.seq_len - 1 + self.offset  # months from a sample's first input to its target
        n_all = T - span
        if n_all < 1:
            raise ValueError(
                f"{meta['files']}: {T} months is fewer than seq_len + offset = {self.seq_len + self.offset} "
                "needs for one sample; use more data or a smaller seq_len/offset"
            )
        n_train, n_val, n_test = _split_counts(n_all, split_ratio)
        start, count = {
            "train": (0, n_train),
            "val": (n_train, n_val),
            "test": (n_train + n_val, n_test),
            None: (0, n_all),
        }[split]
        self._start, self._n, self._span = start, count, span
        self.split_sizes = {"train": n_train, "val": n_val, "test": n_test}

        # statistics from the months that training samples touch, identical for every split object
        self._train_months = n_train + span
        self._clim, self.anomaly_std = self._compute_stats(mm, self._train_months)
        self.climatology_c = self._clim  # (12, H, W) °C, NaN on land
        cal = self.months % 12
        self._cal = cal
        self.target_months = cal[start + span : start + span + count].copy()
        self._norm: torch.Tensor | None = None  # normalised months of this split, once materialised
        self._clim_t: dict[str, torch.Tensor] = {}
        self.info = {
            "source_files": meta["files"],
            "builtin_sample": sample,
            "layout": meta["layout"],
            "variable": meta["variable"],
            "units": meta["units"],
            "source_grid_deg": meta["source_grid_deg"],
            "grid": f"{H} x {W} at {self.resolution:g}° (lats ascending)",
            "months": f"{_month_str(int(self.months[0]))}..{_month_str(int(self.months[-1]))} ({T})",
            "split": split,
            "split_sizes": self.split_sizes,
            "ocean_cells": int(self.ocean_mask.sum()),
            "implausible_values_masked": meta["implausible_values_masked"],
            "normalisation": f"(x - train calendar-month climatology) / {self.anomaly_std:.4f} (train anomaly std)",
            "cache_path": str(self._npy),
            "cache": status,
        }

    # ---- storage -------------------------------------------------------------------------------------------
    def _array(self) -> np.ndarray:
        """The cached (T, H, W) °C memmap, opened lazily (also in each DataLoader worker after unpickling)."""
        if self._mm is None:
            self._mm = np.load(self._npy, mmap_mode="r")
        return self._mm

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_mm"], state["_norm"], state["_clim_t"] = None, None, {}  # workers reopen the memmap
        return state

    def _compute_stats(self, mm: np.ndarray, n_months: int) -> tuple[np.ndarray, float]:
        H, W = mm.shape[1:]
        cal = self.months % 12
        s = np.zeros((12, H, W))
        c = np.zeros(12)
        for t0 in range(0, n_months, 120):
            blk = np.asarray(mm[t0 : min(n_months, t0 + 120)], dtype=np.float64)
            for k, m in enumerate(cal[t0 : t0 + blk.shape[0]]):
                s[m] += blk[k]
                c[m] += 1
        with np.errstate(invalid="ignore"):
            overall = s.sum(0) / c.sum()
            clim = np.where(c[:, None, None] > 0, s / np.maximum(c, 1)[:, None, None], overall[None])
        ss, n = 0.0, 0
        ocean = np.isfinite(clim[0])
        for t0 in range(0, n_months, 120):
            blk = np.asarray(mm[t0 : min(n_months, t0 + 120)], dtype=np.float64)
            anom = blk - clim[cal[t0 : t0 + blk.shape[0]]]
            ss += float(np.sum(anom[:, ocean] ** 2))
            n += anom.shape[0] * int(ocean.sum())
        std = float(np.sqrt(ss / max(n, 1)))
        return clim.astype(np.float32), max(std, 1e-6)

    # ---- samples -------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def _check(self, i: int) -> int:
        if not -self._n <= i < self._n:
            raise IndexError(f"sample {i} out of range for split {self.split!r} with {self._n} samples")
        return i % self._n if self._n else i

    def sample_c(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(x_c, y_c) in °C for sample i of this split: (seq_len-1, H, W) and (H, W), NaN on land."""
        j = self._start + self._check(i)
        mm = self._array()
        return np.array(mm[j : j + self.seq_len - 1]), np.array(mm[j + self._span])

    def _normalise(self, c: np.ndarray, cal: np.ndarray) -> np.ndarray:
        z = (c - self._clim[cal]) / np.float32(self.anomaly_std)
        return np.nan_to_num(z, nan=0.0).astype(np.float32, copy=False)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = self._start + self._check(i)
        mm = self._array()
        x = self._normalise(np.asarray(mm[j : j + self.seq_len - 1]), self._cal[j : j + self.seq_len - 1])
        y = self._normalise(np.asarray(mm[j + self._span]), self._cal[j + self._span])
        return torch.from_numpy(x), torch.from_numpy(y)

    def reference_c(self) -> dict[str, np.ndarray]:
        """°C arrays over every sample of this split for scoring: truth, last input month, climatology of the
        target month and of the last input month, each (N, H, W) with NaN on land."""
        mm = self._array()
        t = np.arange(self._n) + self._start
        last = t + self.seq_len - 2
        return {
            "truth_c": np.asarray(mm[t + self._span]),
            "last_input_c": np.asarray(mm[last]),
            "clim_target_c": self._clim[self._cal[t + self._span]],
            "clim_input_c": self._clim[self._cal[last]],
        }

    # ---- GPU / RAM resident mode ---------------------------------------------------------------------------
    def _materialise(self) -> torch.Tensor:
        """Normalised months of this split as one (T_split, H, W) float32 CPU tensor."""
        lo, hi = self._start, self._start + self._n + self._span
        arr = self._normalise(np.asarray(self._array()[lo:hi]), self._cal[lo:hi])
        return torch.from_numpy(arr)

    @property
    def resident_nbytes(self) -> int:
        return (self._n + self._span) * self.height * self.width * 4

    def maybe_to_device(self, device: torch.device | str) -> bool:
        """Hold this split's normalised array on `device` so `gather` serves batches without workers.

        device_cache=None (auto): on CUDA if it fits in 25% of free GPU memory; on CPU if it fits in 25% of
        available RAM. Returns whether gather() is now served from `device`.
        """
        device = torch.device(device)
        if self.device_cache is False or self._n == 0:
            return False
        need = self.resident_nbytes
        if self.device_cache is None:
            if device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(device)
                if need > 0.25 * free:
                    return False
            elif device.type == "cpu":
                try:
                    import psutil

                    avail = psutil.virtual_memory().available
                except ImportError:  # without psutil assume a modest machine
                    avail = 4 * 2**30
                if need > 0.25 * avail:
                    return False
            else:
                return False
        self._norm = self._materialise().to(device)
        self.info["resident"] = f"{device} ({need / 2**20:.1f} MiB)"
        return True

    def gather(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch of samples by index, gathered from the resident array: (B, seq_len-1, H, W), (B, H, W)."""
        if self._norm is None:
            self._norm = self._materialise()
        if self._norm.device.type == "cpu":
            # numpy's single-threaded take: torch's OpenMP gather collapses (30x measured) when the cores are
            # shared with loader workers or other jobs, and one thread already moves GBs/s here
            arr = self._norm.numpy()
            j = (idx.cpu().numpy() if torch.is_tensor(idx) else np.asarray(idx)).astype(np.int64, copy=False)
            x = np.take(arr, j[:, None] + np.arange(self.seq_len - 1), axis=0)
            return torch.from_numpy(x), torch.from_numpy(np.take(arr, j + self._span, axis=0))
        idx = torch.as_tensor(idx).to(self._norm.device, torch.long)
        steps = torch.arange(self.seq_len - 1, device=idx.device)
        return self._norm[idx[:, None] + steps], self._norm[idx + self._span]

    def denormalize(self, t: torch.Tensor, target_index: int | torch.Tensor) -> torch.Tensor:
        """Normalised field(s) (..., H, W) for the targets of samples `target_index` (same leading dims) -> °C.
        Land comes back NaN: score with `ocean_mask`."""
        key = str(t.device)
        if key not in self._clim_t:
            self._clim_t[key] = torch.from_numpy(self._clim).to(t.device)
        cal = torch.as_tensor(self.target_months)[torch.as_tensor(target_index, dtype=torch.long).cpu()]
        return t.float() * self.anomaly_std + self._clim_t[key][cal.to(t.device)]

    def __repr__(self) -> str:
        return (
            f"ERA5SSTMonthlyDataset(split={self.split!r}, n={self._n}, grid={self.height}x{self.width}, "
            f"seq_len={self.seq_len}, offset={self.offset}, cache={self.info['cache']})"
        )
