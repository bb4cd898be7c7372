"""ERA5 / CF monthly SST files: discovery (file, list, glob, directory) and decoding (SST variable, time,
lat/lon names, units, month order), one scan per file.

`scan_file` opens a file once and returns a `FileEntry` with everything needed to read it later without
guessing again; every problem is an error naming the file and what to do.
"""

from __future__ import annotations

import glob as globlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np

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


LIBRARY_DATA_PATH_HOW = "pass data_path= (a netCDF file, list, glob or directory) or set $ERA5_DATA_PATH"


def resolve_files(
    data_path: str | os.PathLike | Sequence[str | os.PathLike],
    name: str = "data_path",
    how: str = LIBRARY_DATA_PATH_HOW,
) -> list[Path]:
    """Expand a file, a glob, a directory (its *.nc files) or a list of those into existing file paths.

    Errors name the setting as `name` (data_path, --data_path, $ERA5_DATA_PATH) and end with `how` to fix it."""
    if isinstance(data_path, (list, tuple)):
        out: list[Path] = []
        for p in data_path:
            out.extend(resolve_files(p, name, how))
        if not out:
            raise FileNotFoundError(f"{name} is an empty list: give at least one netCDF file")
        return out
    if not isinstance(data_path, (str, os.PathLike)):
        raise TypeError(f"{name} {data_path!r}: give a path, a glob or a list of them; {how}")
    text = os.fspath(data_path)
    p = Path(text).expanduser()
    if p.is_dir():
        files = sorted(q for q in p.iterdir() if q.suffix.lower() in (".nc", ".nc4", ".netcdf") and q.is_file())
        if not files:
            raise FileNotFoundError(f"{name} {p}: the directory holds no .nc/.nc4/.netcdf files; {how}")
        return files
    if p.is_file():  # before globbing: a real file name may contain [ or ?
        return [p]
    if any(c in text for c in "*?["):
        files = sorted(Path(q) for q in globlib.glob(os.path.expanduser(text)))
        if not files:
            raise FileNotFoundError(f"{name} {text!r}: the glob matches no file; {how}")
        return files
    raise FileNotFoundError(f"{name} {p}: ERA5 data file not found; {how}")


NETCDF_MAGIC = (b"CDF", b"\x89HDF\r\n\x1a\n")  # netCDF classic (CDF\x01, \x02, \x05); netCDF4 = HDF5


def _not_netcdf(path: Path) -> str | None:
    """Why `path` is not a netCDF file at all (its first bytes say so), or None when its magic bytes are right."""
    with open(path, "rb") as f:
        head = f.read(64)
        if not head:
            return "the file is empty (0 bytes), not netCDF; fetch it again"
        if head.startswith(NETCDF_MAGIC):
            return None
        offset = 512  # HDF5 may sit after a user block of 512, 1024, 2048, ... bytes
        while offset <= 2**20:
            f.seek(offset)
            if f.read(8) == NETCDF_MAGIC[1]:
                return None
            offset *= 2
    kind = "a text file" if all(32 <= b < 127 or b in b"\t\r\n" for b in head) else "another format"
    return (
        f"not a netCDF file: it starts with {head[:16]!r}, {kind}; netCDF classic files start with b'CDF' and "
        f"netCDF4/HDF5 files with b'\\x89HDF'. Point the data path at the .nc files"
    )


def _open(path: Path) -> netCDF4.Dataset:
    try:
        return netCDF4.Dataset(path, "r")
    except (OSError, RuntimeError, ValueError) as e:
        try:
            why = _not_netcdf(path)
        except OSError as read_error:
            raise ValueError(f"{path}: cannot be read ({read_error})") from e
        if why is not None:
            raise ValueError(f"{path}: {why}") from e
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


def axis_problem(values: np.ndarray, circular: bool = False) -> str | None:
    """Why a 1-D coordinate axis is unusable (None: it is strictly ascending or strictly descending).

    A circular axis (longitude) may also start anywhere on the circle and wrap once, e.g. 180..359, 0..179."""
    v = np.asarray(values, dtype=np.float64)
    if not np.isfinite(v).all():
        k = int(np.flatnonzero(~np.isfinite(v))[0])
        return f"has a missing or non-finite value ({v[k]}) at index {k}"
    d = np.diff(v)
    if (d > 0).all() or (d < 0).all():
        return None
    if circular:  # wrapped once: the offsets from the first value, around the circle, ascend or descend
        up, down = np.diff(np.mod(v - v[0], 360.0)), np.diff(np.mod(v[0] - v, 360.0))
        if (up > 0).all() or (down > 0).all():
            return None
        d = up if (up > 0).sum() >= (down > 0).sum() else -down
    main = 1.0 if (d > 0).sum() >= (d < 0).sum() else -1.0
    k = int(np.flatnonzero(np.sign(d) != main)[0])
    kind = "repeats a value" if v[k + 1] == v[k] else "is not monotonic"
    return f"{kind}: {v[k + 1]:g} at index {k + 1} follows {v[k]:g}"


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
            raise ValueError(f"{path}: no variable {variable!r}; variables found: {names}. Pass variable=NAME")
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
            raise ValueError(f"{path}: variable {var!r} has dims {dims}; found no {what} coordinate among them")

        tname, latname, lonname = (
            pick(TIME_NAMES, "time"),
            pick(LAT_NAMES, "latitude"),
            pick(LON_NAMES, "longitude"),
        )
        if dims[0] != tname or dims[-2:] != (latname, lonname):
            raise ValueError(f"{path}: {var!r} has dims {dims}; expected ({tname}, [expver,] {latname}, {lonname})")
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
            months = np.array([d.year * 12 + d.month - 1 for d in np.atleast_1d(np.asarray(dates))], dtype=np.int64)
        except (OSError, RuntimeError, ValueError) as e:
            raise ValueError(f"{path}: cannot decode time variable {tname!r} ({e})") from e
        if months.size == 0:
            raise ValueError(f"{path}: no time steps")
        bad = np.flatnonzero(np.diff(months) != 1)
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
            raise ValueError(f"{path}: cannot read coordinates ({e}); the file is corrupt or truncated") from e
        if lat.ndim != 1 or lon.ndim != 1:
            raise ValueError(f"{path}: only regular 1-D lat/lon grids are supported (got {lat.shape}, {lon.shape})")
        for name, axis, circular in ((latname, lat, False), (lonname, lon, True)):
            why = axis_problem(axis, circular)
            if why and why.startswith("has a missing"):
                raise ValueError(f"{path}: coordinate {name!r} {why}; every grid point needs a coordinate value")
            if why:
                raise ValueError(
                    f"{path}: coordinate {name!r} {why}; the reader needs a sorted axis without repeats: "
                    f"sort the file along {name!r} (e.g. xarray's ds.sortby({name!r})) and drop repeated values"
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
