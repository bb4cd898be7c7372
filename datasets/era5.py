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

`calendar=True` appends two constant channels to x, cos and sin of the target month's calendar phase
(2π · month / 12, January = 0), so a model can tell the season it forecasts: x is then (seq_len + 1, H, W).
The context months' phases follow from it and the lead (`models.ratransformer` derives them).
`set_prior_plane` appends one more channel, last: a task's per-sample prior forecast (tasks/era5.py's wide-region
priors, which need more than the area's months).

Modules by job: `era5_files` (discovery, scan, CF decoding), `era5_grid` (coarsening plan, `NetCDFSource`),
`era5_cache` (the .npy store), this file (the dataset; it re-exports the public names of the others).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from datasets.area import Area
from datasets.era5_cache import (  # noqa: F401 - CACHE_VERSION re-exported
    CACHE_VERSION,
    _cache_key,
    _load_cache,
    build_cache,
    remove_orphan_temp_files,
)
from datasets.era5_files import (  # noqa: F401 - re-exported: datasets.era5 is the public entry point
    PLAUSIBLE_C,
    FileEntry,
    _month_str,
    default_cache_dir,
    resolve_files,
    scan_file,
)
from datasets.era5_grid import CoarsenPlan, NetCDFSource, coarsen, make_plan  # noqa: F401 - re-exported
from datasets.free_space import make_cache_dir

log = logging.getLogger(__name__)


def _split_counts(n: int, split_ratio: Sequence[float]) -> tuple[int, int, int]:
    r = [float(x) for x in split_ratio]
    if len(r) not in (2, 3) or any(x < 0 for x in r) or sum(r) > 1 + 1e-6 or r[0] <= 0:
        raise ValueError(f"split_ratio={tuple(split_ratio)}: give (train, val[, test]) fractions >= 0 summing to <= 1")
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
        calendar: bool = False,
    ) -> None:
        if split not in self.SPLITS:
            raise ValueError(f"split={split!r}: use 'train', 'val', 'test' or None (all samples)")
        if int(seq_len) != seq_len or seq_len < 2:
            raise ValueError(f"seq_len={seq_len}: must be an integer >= 2 (x holds the previous seq_len - 1 months)")
        if int(offset) != offset or offset < 0:
            raise ValueError(f"offset={offset}: must be an integer >= 0 (extra months between input and target)")
        if not resolution or resolution <= 0:
            raise ValueError(f"resolution={resolution}: must be > 0 degrees")
        self.area = area if area is not None else Area("area", lon=list(lon), lat=list(lat))
        self.seq_len, self.offset, self.resolution = int(seq_len), int(offset), float(resolution)
        self.split, self.device_cache = split, device_cache
        self.calendar = bool(calendar)
        cache = make_cache_dir(cache_dir)
        remove_orphan_temp_files(cache)  # a killed build leaves its temp file behind
        where: tuple[str, ...] = ()  # how errors name the path: data_path= unless it came from the environment
        if data_path is None and os.environ.get("ERA5_DATA_PATH"):
            data_path = os.environ["ERA5_DATA_PATH"]
            where = (
                "$ERA5_DATA_PATH",
                "set $ERA5_DATA_PATH to a netCDF file, directory or glob, or unset it for the built-in sample",
            )
        sample = data_path is None
        if data_path is None:  # the seed's quick start passes no path: use the built-in synthetic sample
            from datasets.era5_sample import ensure_sample_file

            data_path = ensure_sample_file(cache)
        files = resolve_files(data_path, *where)

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
        self._cal = self.months % 12  # calendar month of every file month
        self._clim, self.anomaly_std = self._compute_stats(mm, self._train_months)
        self.climatology_c = self._clim  # (12, H, W) °C, NaN on land
        # absolute month (year * 12 + month - 1) of each target, for labels and year/month bookkeeping
        self.target_abs_months = self.months[start + span : start + span + count].copy()
        self.target_months = self.target_abs_months % 12  # calendar month of each target
        self._norm: torch.Tensor | None = None  # normalised months of this split, once materialised
        self._clim_t: dict[str, torch.Tensor] = {}
        self._plane: np.ndarray | None = None  # set_prior_plane: one more input channel per sample
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
        n_bad = int(meta["implausible_values_masked"] or 0)  # inf, an undeclared fill value, a unit slip
        self.notes = [
            f"data: {n_bad:,} source value(s) outside {PLAUSIBLE_C[0]:g}..{PLAUSIBLE_C[1]:g} °C (inf, a fill value, a "
            f"unit slip) masked as missing, like land; check the files if that is more than a few"
        ] if n_bad else []  # fmt: skip

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
        cal = self._cal
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
        if self.calendar:
            x = np.concatenate([x, self._calendar_planes(np.array([j - self._start]))[0]])
        if self._plane is not None:
            x = np.concatenate([x, self._plane[j - self._start][None]])
        return torch.from_numpy(x), torch.from_numpy(y)

    def set_prior_plane(self, plane: np.ndarray | None) -> None:
        """Append one channel to x, last: a normalised (N, H, W) field per sample of this split (a task's prior
        forecast that needs more than x's months, e.g. a wider region's); None removes it."""
        if plane is not None:
            plane = np.nan_to_num(np.asarray(plane, dtype=np.float32), nan=0.0)
            if plane.shape != (self._n, self.height, self.width):
                raise ValueError(
                    f"set_prior_plane: shape {plane.shape}, the split needs ({self._n}, {self.height}, {self.width})"
                )
        self._plane = plane
        self._clim_t.pop("plane", None)

    def _calendar_planes(self, idx: np.ndarray) -> np.ndarray:
        """(B, 2, H, W) float32: cos and sin of the calendar phase of the targets of samples `idx` of this split."""
        ang = 2 * np.pi * self._cal[self._start + idx + self._span] / 12.0
        cs = np.stack([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
        return np.broadcast_to(cs[:, :, None, None], cs.shape + (self.height, self.width))

    def reference_c(self) -> dict[str, np.ndarray]:
        """°C arrays over every sample of this split for scoring: truth, last input month, climatology of the
        target month and of the last input month, each (N, H, W) with NaN on land."""
        mm = self._array()
        last, target = self.sample_months()
        return {
            "truth_c": np.asarray(mm[target]),
            "last_input_c": np.asarray(mm[last]),
            "clim_target_c": self._clim[self._cal[target]],
            "clim_input_c": self._clim[self._cal[last]],
        }

    def train_anomalies_c(self) -> np.ndarray:
        """(T_train, H, W) °C anomalies (minus the training calendar-month climatology) of the months training
        samples touch, in time order, NaN on land: what statistical baselines are fitted on."""
        return self.anomalies_c(stop=self._train_months)

    def anomalies_c(self, stop: int | None = None) -> np.ndarray:
        """(T, H, W) °C anomalies of the file's months [0, stop) against the training calendar-month
        climatology, NaN on land (index them with `sample_months()`)."""
        n = len(self.months) if stop is None else int(stop)
        return np.asarray(self._array()[:n], dtype=np.float64) - self._clim[self._cal[:n]]

    def sample_months(self) -> tuple[np.ndarray, np.ndarray]:
        """For every sample of this split, the index (into `months`) of its last input month and of its target."""
        t = np.arange(self._n) + self._start
        return t + self.seq_len - 2, t + self._span

    # ---- GPU / RAM resident mode ---------------------------------------------------------------------------
    def _materialise(self) -> torch.Tensor:
        """Normalised months of this split as one (T_split, H, W) float32 CPU tensor."""
        lo, hi = self._start, self._start + self._n + self._span
        arr = self._normalise(np.asarray(self._array()[lo:hi]), self._cal[lo:hi])
        return torch.from_numpy(arr)

    @property
    def resident_nbytes(self) -> int:
        return (self._n + self._span + (self._n if self._plane is not None else 0)) * self.height * self.width * 4

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
            if self.calendar:
                x = np.concatenate([x, self._calendar_planes(j)], axis=1)
            if self._plane is not None:
                x = np.concatenate([x, np.take(self._plane, j, axis=0)[:, None]], axis=1)
            return torch.from_numpy(x), torch.from_numpy(np.take(arr, j + self._span, axis=0))
        ti = torch.as_tensor(idx).to(self._norm.device, torch.long)
        steps = torch.arange(self.seq_len - 1, device=ti.device)
        xt = self._norm[ti[:, None] + steps]
        if self.calendar:
            if "cal" not in self._clim_t:  # cos/sin of every sample's target phase, on the device once
                all_idx = np.arange(self._n)
                self._clim_t["cal"] = torch.from_numpy(self._calendar_planes(all_idx)[:, :, 0, 0].copy()).to(ti.device)
            cs = self._clim_t["cal"][ti]  # (B, 2)
            xt = torch.cat([xt, cs[:, :, None, None].expand(-1, -1, self.height, self.width)], dim=1)
        if self._plane is not None:
            if "plane" not in self._clim_t:  # the prior plane, on the device once
                self._clim_t["plane"] = torch.from_numpy(self._plane).to(ti.device)
            xt = torch.cat([xt, self._clim_t["plane"][ti][:, None]], dim=1)
        return xt, self._norm[ti + self._span]

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
