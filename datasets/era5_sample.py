"""Deterministic synthetic ERA5-like monthly SST files: the built-in sample data of plainloop.

    python -m datasets.era5_sample OUT.nc [--layout legacy|cds2024|cf] [--years 30] [--grid 1.0] [--seed 0]

The field is physically plausible, not real, and as hard to forecast as real monthly SST: a latitudinal
climatology with a Pacific warm pool and cold tongue, a hemispheric seasonal cycle, a slow warming trend, and
anomalies that are
- spatially correlated red noise: smooth large-scale patterns (latitude bands x longitude waves) whose
  coefficients are AR(1) processes with month-to-month persistence 0.65-0.92 (larger scales persist longer),
  so the lag-1 autocorrelation of monthly anomalies is about 0.6-0.9 as in observations;
- an ENSO-like damped stochastic oscillator (period ~4 years, a central-Pacific pattern leading an
  eastern-Pacific one, warm events stronger than cold ones, noise strongest in boreal spring);
- white noise at the grid scale;
plus a few continent-shaped land blobs that are missing data. Every file says `synthetic = "true"` in its
global attributes. Anomaly persistence and a linear inverse model are strong on it, as on real data.

Layouts (the three the reader handles, see datasets/era5_files.py):
- `legacy`: CDS before 2024: time/latitude/longitude, `sst` int16 packed (scale_factor/add_offset, -32767
  fill), K, latitude 90 -> -90, longitude 0 -> 360-grid, netCDF3 64-bit offset.
- `cds2024`: CDS 2024+: valid_time, float32 K with NaN fill, an `expver` string variable, scalar `number`.
- `cf`: a generic CF file: lat/lon names, ascending cell-centre latitudes, longitudes -180..180, °C.
Months are generated in chunks (each month's random numbers seeded from (seed, month); the slow processes
are re-run from month 0 for each chunk, a few hundred numbers per month), so a native 0.25° x 30-year file never
sits in RAM and the content does not depend on the chunk size.
"""

from __future__ import annotations

import argparse
import datetime as dt
import errno
import os
from pathlib import Path
from typing import Literal

import netCDF4
import numpy as np

from datasets.era5_cache import CACHE_HOW, remove_orphan_temp_files, temp_name
from datasets.free_space import make_cache_dir, require_free_space

LAYOUTS = ("legacy", "cds2024", "cf")
SAMPLE_VERSION = 2  # in the cached file's name: a changed generator never reuses an old file
FILL_INT16 = -32767
# Packing range in K (the CDS picks one per file from min/max; a fixed one keeps chunked writes consistent).
_K_MIN, _K_MAX = 268.0, 312.0
SCALE = (_K_MAX - _K_MIN) / (2**16 - 2)
OFFSET = (_K_MAX + _K_MIN) / 2
# Continent-ish ellipses: (centre lon °E in [0, 360), centre lat, lon radius, lat radius).
_LAND = [
    (255.0, 45.0, 28.0, 18.0),  # North America
    (295.0, -15.0, 14.0, 24.0),  # South America
    (80.0, 50.0, 60.0, 18.0),  # Eurasia
    (20.0, 5.0, 17.0, 27.0),  # Africa
    (134.0, -25.0, 16.0, 10.0),  # Australia
]
NOISE_STD_C = 0.25  # white noise per grid point and month (averages down when coarsened)
TREND_C_PER_YEAR = 0.012  # slow warming, as in the observed record
# Red noise: latitude bands every 10° (Gaussian, 9° wide) x longitude waves 0..6 (cos, sin).
_BAND_LATS = np.arange(-85.0, 86.0, 10.0)
_BAND_WIDTH = 9.0
_WAVES = 6
RED_STD_C = 0.18  # stationary std of each pattern coefficient
# ENSO-like oscillator: damping per month, period, and the std of its monthly kicks.
ENSO_DAMPING = 0.965
ENSO_PERIOD_MONTHS = 46.0
ENSO_KICK = 0.3


def grid_coords(layout: str, grid: float) -> tuple[np.ndarray, np.ndarray]:
    """(lat, lon) 1-D coordinate vectors of a sample file in `layout` at `grid` degrees."""
    n_lon = int(round(360.0 / grid))
    if layout == "cf":  # cell centres, ascending, -180..180 like many CF products (OISST-style)
        n_lat = int(round(180.0 / grid))
        lat = -90.0 + grid * (np.arange(n_lat) + 0.5)
        lon = -180.0 + grid * (np.arange(n_lon) + 0.5)
    else:  # ERA5: points on the grid lines, latitude 90 -> -90, longitude 0 -> 360 - grid
        n_lat = int(round(180.0 / grid)) + 1
        lat = 90.0 - grid * np.arange(n_lat)
        lon = grid * np.arange(n_lon)
    return lat, lon


def land_mask(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """(nlat, nlon) bool, True on the synthetic continents and Antarctica."""
    lat2 = lat[:, None]
    lon2 = np.mod(lon, 360.0)[None, :]
    land = np.broadcast_to(lat2 < -72.0, (lat.size, lon.size)).copy()
    for clon, clat, rlon, rlat in _LAND:
        dlon = (lon2 - clon + 180.0) % 360.0 - 180.0
        land |= (dlon / rlon) ** 2 + ((lat2 - clat) / rlat) ** 2 <= 1.0
    return land


def _persistence(seed: int) -> np.ndarray:
    """AR(1) coefficient of every red-noise pattern (bands x (1 + 2 * waves)): 0.92 for the largest scales
    down to about 0.65 for wave 6, with a fixed jitter."""
    k = np.concatenate([[0], np.repeat(np.arange(1, _WAVES + 1), 2)])  # wavenumber of each column
    jitter = np.random.default_rng([seed, 2**31 - 1]).uniform(-0.03, 0.03, (_BAND_LATS.size, k.size))
    return np.clip(0.92 - 0.045 * k[None, :] + jitter, 0.5, 0.95)


def _slow_states(n_months: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Red-noise pattern coefficients (T, bands, columns) and the ENSO oscillator (T, 2) for months 0..T-1.

    Month t's kicks come from its own generator seeded (seed, t, 1), so any chunk of months recomputes the
    same states from month 0 (a few hundred numbers per month)."""
    phi = _persistence(seed)
    scale = RED_STD_C * np.sqrt(1.0 - phi**2)
    theta = 2 * np.pi / ENSO_PERIOD_MONTHS
    rot = ENSO_DAMPING * np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    red = np.zeros((n_months,) + phi.shape)
    enso = np.zeros((n_months, 2))
    c, z = np.zeros(phi.shape), np.zeros(2)
    for t in range(n_months):
        rng = np.random.default_rng([seed, t, 1])
        c = phi * c + scale * rng.standard_normal(phi.shape)
        spring = 1.0 + 0.5 * np.cos(2 * np.pi * ((t % 12) - 3) / 12.0)  # kicks strongest around April
        z = rot @ z + ENSO_KICK * spring * rng.standard_normal(2)
        red[t], enso[t] = c, z
    return red, enso


def sst_celsius(months: np.ndarray, lat: np.ndarray, lon: np.ndarray, seed: int = 0) -> np.ndarray:
    """Synthetic SST in °C, shape (len(months), nlat, nlon), NaN on land. `months` counts from the start month
    (0 = January of the start year); month t is the same whatever chunk it is made in."""
    months = np.asarray(months, dtype=np.int64)
    phi = np.deg2rad(lat)[:, None]
    lon360 = np.mod(lon, 360.0)[None, :]
    base = 29.0 * np.cos(phi) ** 2 - 1.0
    base = base + 1.5 * np.exp(-(((lon360 - 150.0) / 40.0) ** 2) - (lat[:, None] / 15.0) ** 2)  # warm pool
    base = base - 2.0 * np.exp(-(((lon360 - 260.0) / 30.0) ** 2) - (lat[:, None] / 6.0) ** 2)  # cold tongue
    seasonal_amp = 3.5 * np.sin(phi) * np.exp(-(((np.abs(lat[:, None]) - 40.0) / 30.0) ** 2))
    east = np.exp(-((lat[:, None] / 9.0) ** 2)) * np.exp(-(((lon360 - 245.0) / 40.0) ** 2))  # Niño 3-like
    central = np.exp(-((lat[:, None] / 12.0) ** 2)) * np.exp(-(((lon360 - 185.0) / 35.0) ** 2))  # Niño 4-like
    bands = np.exp(-(((lat[:, None] - _BAND_LATS[None, :]) / _BAND_WIDTH) ** 2))  # (nlat, bands)
    bands *= 0.6 + 0.8 * np.abs(np.sin(np.deg2rad(_BAND_LATS)))[None, :]  # mid-latitudes vary more
    lam = np.deg2rad(np.mod(lon, 360.0))
    wave_list = [np.ones_like(lam)]
    for k in range(1, _WAVES + 1):
        wave_list += [np.cos(k * lam), np.sin(k * lam)]
    waves = np.stack(wave_list)  # (columns, nlon)
    land = land_mask(lat, lon)
    red, enso = _slow_states(int(months.max()) + 1 if months.size else 0, seed)

    out = np.empty((len(months), lat.size, lon.size), dtype=np.float32)
    for k, t in enumerate(months):
        cal = t % 12
        season = seasonal_amp * np.cos(2 * np.pi * (cal - 7) / 12.0)  # NH warmest in August
        z0, z1 = enso[t]
        warm_skew = z0 + 0.25 * np.maximum(z0, 0.0) ** 2  # warm events grow larger than cold ones
        anomaly = bands @ red[t] @ waves + 0.9 * warm_skew * east + 0.6 * z1 * central
        trend = TREND_C_PER_YEAR * t / 12.0
        rng = np.random.default_rng([seed, int(t)])  # per-month stream: chunking never changes the data
        noise = NOISE_STD_C * rng.standard_normal((lat.size, lon.size))
        field = np.maximum(base + season + trend + anomaly + noise, -1.8)  # sea water freezes near -1.8 °C
        field[land] = np.nan
        out[k] = field
    return out


def sample_nbytes(layout: str, n_months: int, grid: float, expver_dim: bool = False) -> int:
    """About how many bytes `write_sample_file` writes: the SST field (int16 packed for legacy, float32
    otherwise, uncompressed) plus 64 KiB of coordinates and header."""
    lat, lon = grid_coords(layout, grid)
    itemsize = 2 if layout == "legacy" else 4
    return n_months * lat.size * lon.size * itemsize * (2 if expver_dim else 1) + 64 * 2**10


def _times(start_year: int, n_months: int) -> list[dt.datetime]:
    return [dt.datetime(start_year + m // 12, m % 12 + 1, 1) for m in range(n_months)]


def _check_args(layout: str, years: int, grid: float, months: int | None = None) -> int:
    """The number of months, or a ValueError naming the bad setting."""
    if layout not in LAYOUTS:
        raise ValueError(f"--layout {layout!r} is not one of {LAYOUTS}")
    n_months = int(months) if months is not None else int(years) * 12
    if n_months < 1:
        raise ValueError(f"--years {years} / months {months}: need at least one month")
    if not (0.05 <= grid <= 30.0) or abs(360.0 / grid - round(360.0 / grid)) > 1e-6:
        raise ValueError(f"--grid {grid}: must divide 360 (e.g. 0.25, 0.5, 1, 2.5)")
    return n_months


def write_sample_file(
    path: str | os.PathLike,
    layout: str = "legacy",
    years: int = 30,
    grid: float = 1.0,
    seed: int = 0,
    start_year: int = 1990,
    chunk_months: int = 12,
    expver_dim: bool = False,
    units: str | None = "auto",
    units_on_file: bool = False,
    months: int | None = None,
) -> Path:
    """Write a synthetic monthly SST file and return its path (written in place; see `ensure_sample_file`
    for an atomic, cached one).

    `months` overrides `years`. Test-only knobs: `expver_dim` (legacy: a (time, expver) field where the last
    3 months come from expver 5 and the rest from expver 1, as CDS served ERA5T), `units` (None = no units
    attribute; "auto" = K for CDS layouts, degC for cf) and `units_on_file` (units only as a global attribute).
    """
    n_months = _check_args(layout, years, grid, months)
    path = Path(path)
    # netCDF-C on a full disk can crash the process: refuse before the file is created
    require_free_space(path, sample_nbytes(layout, n_months, grid, expver_dim), "free space there or write elsewhere")
    lat, lon = grid_coords(layout, grid)
    celsius = layout == "cf"
    if units == "auto":
        units = "degC" if celsius else "K"
    times = _times(start_year, n_months)
    fmt: Literal["NETCDF3_64BIT_OFFSET", "NETCDF4"] = "NETCDF3_64BIT_OFFSET" if layout == "legacy" else "NETCDF4"

    with netCDF4.Dataset(path, "w", format=fmt) as nc:
        nc.title = "Synthetic ERA5-like monthly mean sea surface temperature (NOT real data)"
        nc.synthetic = "true"
        nc.source = f"plainloop datasets.era5_sample layout={layout} grid={grid} seed={seed}"
        nc.Conventions = "CF-1.6"
        if units_on_file and units is not None:
            nc.units = units
        tname, latname, lonname = {
            "legacy": ("time", "latitude", "longitude"),
            "cds2024": ("valid_time", "latitude", "longitude"),
            "cf": ("time", "lat", "lon"),
        }[layout]
        nc.createDimension(tname, None if layout == "legacy" else n_months)
        if expver_dim:
            nc.createDimension("expver", 2)
        nc.createDimension(latname, lat.size)
        nc.createDimension(lonname, lon.size)

        if layout == "cds2024":
            tv = nc.createVariable(tname, "i8", (tname,))
            tv.units, tv.calendar = "seconds since 1970-01-01", "proleptic_gregorian"
        else:
            tv = nc.createVariable(tname, "i4" if layout == "legacy" else "f8", (tname,))
            tv.units, tv.calendar = "hours since 1900-01-01 00:00:00.0", "gregorian"
        tv.long_name, tv.standard_name = "time", "time"
        tv[:] = netCDF4.date2num(times, tv.units, tv.calendar)
        latv = nc.createVariable(latname, "f8" if layout == "cds2024" else "f4", (latname,))
        latv.units, latv.standard_name = "degrees_north", "latitude"
        latv[:] = lat
        lonv = nc.createVariable(lonname, "f8" if layout == "cds2024" else "f4", (lonname,))
        lonv.units, lonv.standard_name = "degrees_east", "longitude"
        lonv[:] = lon
        if layout == "cds2024":
            nv = nc.createVariable("number", "i8")
            nv.long_name = "ensemble member numerical id"
            nv.assignValue(0)
            ev = nc.createVariable("expver", str, (tname,))
            for i in range(n_months):
                ev[i] = "0001"
        if expver_dim:
            ev = nc.createVariable("expver", "i4", ("expver",))
            ev[:] = [1, 5]

        dims = (tname, "expver", latname, lonname) if expver_dim else (tname, latname, lonname)
        if layout == "legacy":
            var = nc.createVariable("sst", "i2", dims, fill_value=FILL_INT16)
            var.scale_factor, var.add_offset, var.missing_value = SCALE, OFFSET, np.int16(FILL_INT16)
        else:
            var = nc.createVariable("sst", "f4", dims, fill_value=np.float32(np.nan))
        var.set_auto_maskandscale(False)  # we pack and fill by hand: one code path for every layout
        var.long_name, var.standard_name = "Sea surface temperature", "sea_surface_temperature"
        if units is not None and not units_on_file:
            var.units = units

        for t0 in range(0, n_months, chunk_months):
            t1 = min(n_months, t0 + chunk_months)
            block = sst_celsius(np.arange(t0, t1), lat, lon, seed)
            if not celsius:
                block += np.float32(273.15)
            if layout == "legacy":
                packed = np.round((block - OFFSET) / SCALE)
                packed = np.where(np.isfinite(packed), packed, FILL_INT16).astype(np.int16)
                block = packed
            if expver_dim:
                fill = FILL_INT16 if layout == "legacy" else np.nan
                two = np.full((t1 - t0, 2) + block.shape[1:], fill, dtype=block.dtype)
                is_t = np.arange(t0, t1) >= n_months - 3  # ERA5T (expver 5) serves the final months
                two[~is_t, 0] = block[~is_t]
                two[is_t, 1] = block[is_t]
                block = two
            var[t0:t1] = block
    return path


def default_cache_dir() -> Path:
    """$PLAINLOOP_CACHE, else ~/.cache/plainloop."""
    return Path(os.environ.get("PLAINLOOP_CACHE") or Path.home() / ".cache" / "plainloop")


def ensure_sample_file(
    cache_dir: str | os.PathLike | None = None,
    layout: str = "legacy",
    years: int = 30,
    grid: float = 1.0,
    seed: int = 0,
) -> Path:
    """Path of the built-in sample file, generated once (temp file + rename, so a crash never leaves half a
    file behind) into `cache_dir` (default $PLAINLOOP_CACHE or ~/.cache/plainloop). Without room for it, an
    OSError (ENOSPC) naming the file, before anything is written."""
    cache = make_cache_dir(cache_dir)
    path = cache / f"era5_sample_v{SAMPLE_VERSION}_{layout}_{years}y_{grid:g}deg_seed{seed}.nc"
    if path.is_file() and path.stat().st_size > 0:
        return path
    n_months = _check_args(layout, years, grid)
    remove_orphan_temp_files(cache)  # an interrupted generation's temp file takes room the new one needs
    require_free_space(path, sample_nbytes(layout, n_months, grid), CACHE_HOW)
    tmp = temp_name(path)
    try:
        write_sample_file(tmp, layout=layout, years=years, grid=grid, seed=seed)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out", help="output netCDF path")
    p.add_argument("--layout", choices=LAYOUTS, default="legacy", help="file layout (default: legacy)")
    p.add_argument("--years", type=int, default=30, help="number of years from 1990 (default: 30)")
    p.add_argument("--grid", type=float, default=1.0, help="grid spacing in degrees; 0.25 = native ERA5 (default: 1.0)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the noise (default: 0)")
    p.add_argument("--start-year", type=int, default=1990, help="first year (default: 1990)")
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        n_months = _check_args(args.layout, args.years, args.grid)
    except ValueError as e:
        p.error(str(e))
    try:
        require_free_space(out, sample_nbytes(args.layout, n_months, args.grid), "free space there or write elsewhere")
    except OSError as e:  # exit 4: an I/O failure, as in train_optimized.py
        why = e.strerror if e.errno == errno.ENOSPC else f"{out.parent}: {e.strerror}"
        p.exit(4, f"{p.prog}: error: {why}\n")
    tmp = temp_name(out)
    try:
        write_sample_file(tmp, args.layout, args.years, args.grid, args.seed, args.start_year)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    lat, lon = grid_coords(args.layout, args.grid)
    print(
        f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): synthetic {args.layout} SST, {args.years * 12} months, "
        f"{lat.size} x {lon.size} grid at {args.grid:g}°"
    )


if __name__ == "__main__":
    main()
