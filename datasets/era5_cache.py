"""The coarse-array cache: (T, H, W) float32 °C `.npy` (memory-mapped by readers) plus a JSON sidecar, keyed by
the source files (path, size, mtime), area, resolution and variable. Written atomically (temp file, rename,
sidecar last); a stale or corrupt cache is rebuilt, never trusted; temp files left by a killed build are
removed at the next start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from datasets.area import Area
from datasets.era5_files import _open
from datasets.era5_grid import NetCDFSource, coarsen
from datasets.free_space import require_free_space, reserve

log = logging.getLogger("datasets.era5")

CACHE_VERSION = 1  # in the cache key: bump it when the cached array would come out different

# Temp files of a cache or sample build: `.era5_<name>.<host>~<pid>.tmp[.npy]`; older builds wrote no host.
_TEMP_RE = re.compile(r"^\.era5_.+?\.(?:(?P<host>[A-Za-z0-9_-]*)~)?(?P<pid>\d+)\.tmp(?:\.npy)?$")
ORPHAN_GRACE_S = 120.0  # a temp file whose writer is gone is kept this long (its writer may be on another host)
ORPHAN_STALE_S = 3600.0  # a build rewrites its temp file steadily: untouched this long means nobody writes it
CACHE_HOW = (
    "free space there, or point the cache elsewhere with --cache_dir DIR (cache_dir= in Python) or $PLAINLOOP_CACHE"
)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:40]


def temp_name(target: Path, npy: bool = False) -> Path:
    """The temp file a build writes before renaming it to `target`: host and pid in the name, so the next start
    on this host can tell at once that its writer is gone."""
    return target.with_name(f".{target.name}.{_host()}~{os.getpid()}.tmp" + (".npy" if npy else ""))


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if os.name != "posix":
        return True  # os.kill(pid, 0) would end the process on Windows: leave it to the age rule
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def remove_orphan_temp_files(
    cache_dir: str | os.PathLike, grace_s: float = ORPHAN_GRACE_S, stale_s: float = ORPHAN_STALE_S
) -> list[Path]:
    """Delete temp files a killed build left in `cache_dir` (they can be GBs for native 0.25° data).

    A temp file is removed at once when its name says this host wrote it and that pid no longer runs; a file
    from another host (or without a host in its name) when its pid does not run here and it is older than
    `grace_s`; any file nobody has modified for `stale_s` (the pid was reused). Files being written by a live
    process here are never touched. Each removal is one warning line. Returns the removed paths."""
    removed: list[Path] = []
    now = time.time()
    me = _host()
    try:
        entries = list(os.scandir(os.fspath(cache_dir)))
    except OSError:
        return removed
    for e in entries:
        m = _TEMP_RE.match(e.name)
        if m is None or not e.is_file(follow_symlinks=False):
            continue
        try:
            age = now - e.stat(follow_symlinks=False).st_mtime
        except OSError:  # renamed or removed by its writer meanwhile
            continue
        pid = int(m["pid"])
        gone = not _pid_alive(pid)
        orphan = (gone and (m["host"] == me or age > grace_s)) or age > stale_s
        if not orphan:
            continue
        try:
            size = e.stat(follow_symlinks=False).st_size
            os.unlink(e.path)
        except OSError:
            continue
        removed.append(Path(e.path))
        log.warning(
            "removed %s (%.1f MB): left by an interrupted build (writer pid %d gone, %.0f s old)",
            e.path,
            size / 1e6,
            pid,
            age,
        )
    return removed


def other_temp_files(folder: Path) -> str:
    """'' or a note for a full-disk error: temp files of other builds still in `folder` and what they take."""
    found = []
    try:
        for e in os.scandir(folder):
            if _TEMP_RE.match(e.name) and e.is_file(follow_symlinks=False):
                found.append((e.path, e.stat(follow_symlinks=False).st_size))
    except OSError:
        return ""
    if not found:
        return ""
    total = sum(n for _, n in found)
    return (
        f"; {len(found)} temp file(s) of other or interrupted builds take {total / 1e6:,.1f} MB there "
        f"(e.g. {found[0][0]}): delete them if no other run is building"
    )


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
        if arr.dtype != np.float32 or list(arr.shape) != meta["shape"] or npy.stat().st_size != meta["nbytes_file"]:
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
    tmp = temp_name(npy, npy=True)
    any_nan = np.zeros((p.height, p.width), dtype=bool)
    nbytes = T * p.height * p.width * 4 + 4096  # float32 data, the .npy header and the JSON sidecar
    how = CACHE_HOW + other_temp_files(npy.parent)
    require_free_space(npy, nbytes, how)  # before any byte is written: a full memmap is a SIGBUS, not an error
    try:
        mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(T, p.height, p.width))
        reserve(tmp, os.path.getsize(tmp), npy, how)  # the blocks, now: a disk that fills meanwhile fails here
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
    tmpj = temp_name(meta_path)
    try:
        tmpj.write_text(json.dumps(meta))
        os.replace(tmpj, meta_path)  # the sidecar is written last: it marks the cache complete
    finally:
        tmpj.unlink(missing_ok=True)
    return meta
