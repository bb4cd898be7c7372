"""From source grid to coarse cells: the coarsening plan (which source rows/columns feed which cell of an area
at a resolution), the NaN-aware cos-latitude weighted area mean, and `NetCDFSource`, which reads the months of
one or more scanned files in time order (masked -> NaN, K -> °C, implausible values dropped, ERA5T expver
merged) and coarsens them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import netCDF4
import numpy as np

from datasets.area import Area
from datasets.era5_files import CHUNK_BYTES, PLAUSIBLE_C, FileEntry, _month_str, _open, scan_file


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
        f"data covers lat {lat.min():g}..{lat.max():g}, lon {lon.min():g}..{lon.max():g} ({dlat:g}° x {dlon:g}° grid)"
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
                raise ValueError(f"{cur.path}: duplicated month {_month_str(cur.first)} (also in {prev.path})")
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
        ds = _open(entry.path) if nc is None else nc
        try:
            # netCDF4 applies scale/offset and masks _FillValue/missing_value; filled(NaN) keeps fills out
            a = np.ma.filled(ds.variables[entry.var][tuple(idx)].astype(np.float32), np.nan)
        except (OSError, RuntimeError, IndexError) as e:
            raise ValueError(
                f"{entry.path}: cannot read {entry.var!r} months {t0}..{t1} ({e}); "
                "the file is corrupt or truncated, fetch it again"
            ) from e
        finally:
            if own:
                ds.close()
        if entry.expver_axis is not None:  # ERA5T: the last expver present wins, earlier ones fill the gaps
            # size-1 level dims were indexed away, so expver is axis 1 of (t, expver, lat, lon)
            merged = a[:, -1]
            for k in range(a.shape[1] - 2, -1, -1):
                merged = np.where(np.isfinite(merged), merged, a[:, k])
            a = merged
        kelvin = entry.units == "K"
        if entry.units is None:  # no units anywhere: ocean SST above 100 can only be Kelvin
            if entry.path not in self._kelvin_guess:
                self._kelvin_guess[entry.path] = bool(np.nanmedian(a) > 100.0) if np.isfinite(a).any() else False
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
