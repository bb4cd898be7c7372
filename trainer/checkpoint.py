"""Atomic checkpoints that load with weights_only=True, so a checkpoint can never run code on load."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch


class CheckpointError(RuntimeError):
    pass


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """torch.save to a temp file in the same folder, fsync, then rename: a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        # fsync the directory so the rename itself survives a power cut (not possible on Windows)
        if hasattr(os, "O_DIRECTORY"):
            dfd = os.open(path.parent, os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load with weights_only=True; anything that needs unpickling arbitrary objects is refused."""
    path = Path(path)
    if path.is_dir():  # a run directory: continue from its last checkpoint
        path = path / "checkpoints" / "last.pt"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; pass a last.pt/best.pt file or a run directory")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"refusing to load {path}: it is not loadable with weights_only=True (it holds pickled Python "
            f"objects, which could run code). Only plainloop checkpoints or plain state dicts are accepted. "
            f"Detail: {str(e).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated and cannot be read: {e}") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise CheckpointError(
            f"{path} is not a plainloop checkpoint (no 'model' entry); keys: "
            f"{sorted(ckpt)[:10] if isinstance(ckpt, dict) else type(ckpt).__name__}"
        )
    return ckpt


def remove_orphan_temps(folder: Path) -> list[Path]:
    """Delete temp files a killed atomic_save left behind (interim; superseded by the integrity work)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    old = [p for p in folder.glob(".*.tmp") if p.stat().st_mtime < __import__("time").time() - 600]
    for p in old:
        p.unlink(missing_ok=True)
    return old
