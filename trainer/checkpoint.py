"""Checkpoints: the file format is the leaf's (trainer/support/checkpoint_file.py: atomic writes, the digest,
weights_only loading); here, what a resume path means for a run directory.

- `load_checkpoint` takes a checkpoint file or a run directory (its checkpoints/last.pt), refuses pickled
  objects, reports damaged files as corrupt, and marks checkpoints without a digest unverified.
- `atomic_save`, `storable`, `restore`, `snapshot_to_host`, `remove_orphan_temps`: the leaf's, public here.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .support import (
    DIGEST_KEY,
    INTEGRITY_KEY,
    NUMPY_KEY,
    STORAGE_ERRNOS,
    UNVERIFIED,
    CheckpointError,
    NotStorable,
    StateDict,
    StorageError,
    atomic_save,
    atomic_write,
    atomic_write_text,
    check_digest,
    check_free_space,
    remove_orphan_temps,
    restore,
    safe_load,
    snapshot_to_host,
    state_digest,
    storable,
    storage_error,
)

__all__ = [
    "DIGEST_KEY", "INTEGRITY_KEY", "NUMPY_KEY", "STORAGE_ERRNOS", "UNVERIFIED", "CheckpointError", "NotStorable",
    "StateDict", "StorageError", "atomic_save", "atomic_write", "atomic_write_text", "check_free_space",
    "checkpoint_file", "load_checkpoint", "not_a_checkpoint", "remove_orphan_temps", "restore", "snapshot_to_host",
    "state_digest", "storable", "storage_error",
]  # fmt: skip


def load_checkpoint(
    path: str | os.PathLike, map_location: str | torch.device = "cpu", *, verify: bool = True
) -> StateDict:
    """Load a checkpoint file or a run directory's last.pt with weights_only=True and check its digest.

    The returned dict has no digest entry; its INTEGRITY_KEY entry says "verified" or why not (UNVERIFIED for
    checkpoints written without a digest)."""
    file = checkpoint_file(path)
    ckpt = safe_load(file, map_location)
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise not_a_checkpoint(file, ckpt)
    return check_digest(ckpt, file, verify)


def checkpoint_file(path: str | os.PathLike) -> Path:
    """The file a resume from `path` reads: the file itself, or a run directory's checkpoints/last.pt; a missing
    one is a CheckpointError that says what the directory holds instead."""
    given = path = Path(path)
    if path.is_dir() and path.suffix != ".pt":  # a run directory: continue from its last checkpoint
        path = path / "checkpoints" / "last.pt"
    if path.is_dir():
        raise CheckpointError(
            f"checkpoint {path} is a directory, not a checkpoint file; move it away and resume from another "
            f"checkpoint (best.pt, an earlier copy)"
        )
    if path.is_file():
        return path
    if given == path:
        raise CheckpointError(f"checkpoint {path} does not exist; pass a last.pt/best.pt file or a run directory")
    best = given / "checkpoints" / "best.pt"
    if best.is_file():
        raise CheckpointError(
            f"{path} does not exist: the run stopped before its first last.pt; {best} holds its best weights so far "
            f"(resume from that file to continue from its step), or start the run again"
        )
    if any((given / name).exists() for name in ("checkpoints", "config.json", ".plainloop-run")):  # a run's files
        raise CheckpointError(
            f"{path} does not exist: the run stopped before it saved a checkpoint, so there is nothing to resume; "
            f"start the run again"
        )
    raise CheckpointError(
        f"{given} is not a run directory ({path} does not exist); pass a run directory (OUTPUT_DIR/RUN_NAME) or a "
        f"last.pt/best.pt file"
    )


def not_a_checkpoint(path: Path, obj: object) -> CheckpointError:
    """A file that loads but holds no plainloop checkpoint (a bare state dict, a tensor, another tool's file)."""
    what = (
        f"no 'model' entry; keys: {sorted(map(str, obj))[:10]}" if isinstance(obj, dict) else f"a {type(obj).__name__}"
    )
    return CheckpointError(
        f"{path} is not a plainloop checkpoint ({what}); resume from a run directory or its checkpoints/last.pt or "
        f"best.pt (plain weights load with model.load_state_dict(torch.load(...)) instead)"
    )
