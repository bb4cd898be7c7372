"""The leaf below the engine: what knows nothing of training (docs/concepts/trainer.md).

Files written whole (atomic writes, orphan temps, strict JSON, TOML), the checkpoint file (its digest, safe
loading, what it may hold), the directory lock, and the typed-value validator. It imports nothing else of the
engine and knows no flag; the engine's modules (checkpoint.py, runfiles.py, config.py) are its public face.
"""

from .checkpoint_file import (
    DIGEST_KEY,
    INTEGRITY_KEY,
    NUMPY_KEY,
    UNVERIFIED,
    CheckpointError,
    NotStorable,
    StateDict,
    atomic_save,
    check_digest,
    restore,
    safe_load,
    snapshot_to_host,
    state_digest,
    storable,
)
from .files import (
    STORAGE_ERRNOS,
    StorageError,
    atomic_write,
    atomic_write_text,
    check_free_space,
    move_jsonl_rows,
    remove_orphan_temps,
    storage_error,
    strict_json,
    write_config_file,
)
from .lock import STORAGE_PROBLEMS, RunDirError, RunDirGone, RunLock, busy_error, writable_dir_problem
from .random_state import RngState, rng_state, seed_everything, set_rng_state
from .values import (
    INT_LIMIT,
    RULE_KEYS,
    ConfigError,
    Rule,
    Rules,
    TypeForm,
    check_settings,
    check_value,
    describe,
    field_rules,
    knob,
    show_value,
    unknown_keys,
    unwrap,
)

__all__ = [
    "CheckpointError", "ConfigError", "DIGEST_KEY", "INTEGRITY_KEY", "INT_LIMIT", "NUMPY_KEY", "NotStorable",
    "RULE_KEYS", "RngState", "Rule", "Rules", "RunDirError", "RunDirGone", "RunLock", "STORAGE_ERRNOS",
    "STORAGE_PROBLEMS", "StateDict", "StorageError", "TypeForm", "UNVERIFIED", "atomic_save", "atomic_write",
    "atomic_write_text", "busy_error", "check_digest", "check_free_space", "check_settings", "check_value",
    "describe", "field_rules", "knob", "move_jsonl_rows", "remove_orphan_temps", "restore", "rng_state",
    "safe_load", "seed_everything", "set_rng_state", "show_value", "snapshot_to_host", "state_digest", "storable",
    "storage_error", "strict_json", "unknown_keys", "unwrap", "writable_dir_problem", "write_config_file",
]  # fmt: skip
