"""The leaf below the engine (trainer/support/): files written whole, the checkpoint file, the directory lock, the
random state and the typed-value validator, tested through its public list alone."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import tomllib
import torch

import trainer.support as support
from trainer.support import (
    INTEGRITY_KEY,
    CheckpointError,
    ConfigError,
    RngState,
    RunDirError,
    RunLock,
    atomic_save,
    atomic_write,
    check_digest,
    check_value,
    move_jsonl_rows,
    safe_load,
    storable,
    strict_json,
    write_config_file,
)


def test_the_public_list_is_what_the_package_holds():
    assert all(hasattr(support, name) for name in support.__all__)
    assert len(support.__all__) == len(set(support.__all__))


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")

    def half(fh: object) -> None:
        fh.write(b"new")  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, half)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_checkpoint_round_trips_with_its_digest_and_a_flipped_value_is_caught(tmp_path):
    path = atomic_save(
        {"model": {"w": torch.arange(4.0)}, "step": 3, "np": storable(np.float32(2.5))}, tmp_path / "c.pt"
    )
    ckpt = check_digest(safe_load(path), path)  # type: ignore[arg-type]
    assert ckpt[INTEGRITY_KEY] == "verified" and ckpt["np"] == np.float32(2.5) and ckpt["step"] == 3
    raw = torch.load(path, weights_only=True)
    raw["step"] = 4
    with pytest.raises(CheckpointError, match="do not match the digest"):
        check_digest(raw, path)


def test_a_held_lock_refuses_a_second_holder_with_the_callers_advice(tmp_path):
    held = RunLock(tmp_path, fix="try the other door")
    try:
        with pytest.raises(RunDirError, match="another live process .*; try the other door"):
            RunLock(tmp_path, record=False, fix="try the other door")
    finally:
        held.release()
    RunLock(tmp_path).release()  # free once released


def test_the_validator_converts_and_names_the_bad_value():
    assert check_value("--n", "3", int, {"min": 1}) == 3
    assert check_value("--mode", "b", Literal["a", "b"], {}) == "b"
    with pytest.raises(ConfigError, match=r"^--lr nan: not finite; use a finite number > 0$"):
        check_value("--lr", "nan", float, {"gt": 0})


def test_rows_move_by_the_callers_rule_and_damaged_lines_with_them(tmp_path):
    path, target, junk = tmp_path / "m.jsonl", tmp_path / "moved.jsonl", []
    path.write_bytes(b'{"step": 1}\n{"step": 5}\nnot json\n{"step": 2}\n{"step": 9')
    assert move_jsonl_rows(path, target, lambda row: row["step"] > 2, junk) == 2  # step 5 and the torn line
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2] and junk == [3]
    assert target.read_text().count("\n") == 3


def test_json_and_toml_writers_write_what_the_readers_read(tmp_path):
    bad: list[str] = []
    assert strict_json({"a": float("nan"), "b": [1.0, float("inf")]}, bad) == {"a": None, "b": [1.0, None]}
    assert bad == ["a", "b[1]"]
    p = write_config_file(tmp_path / "c.toml", {"train": {"lr": 0.5, "name": "x", "off": None, "t": (1, 2)}}, "hi")
    assert tomllib.loads(Path(p).read_text()) == {"train": {"lr": 0.5, "name": "x", "t": [1, 2]}}


def test_the_random_state_round_trips_through_a_checkpoint(tmp_path):
    rng = RngState()
    path = atomic_save({"model": {}, "rng": rng.state_dict()}, tmp_path / "r.pt")
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    rng.load_state_dict(check_digest(safe_load(path), path)["rng"])  # type: ignore[arg-type]
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


@pytest.mark.parametrize(
    "module, names",
    [
        ("trainer.checkpoint", "atomic_save atomic_write check_free_space state_digest storable restore NotStorable"),
        ("trainer.runfiles", "RunLock RunDirError RunDirGone strict_json write_config_file roll_back_metrics"),
        ("trainer.config", "ConfigError check_value check_settings field_rules knob unwrap INT_LIMIT RULE_KEYS"),
        ("trainer.runtime", "rng_state set_rng_state seed_everything"),
    ],
)
def test_the_names_that_moved_to_the_leaf_keep_their_old_import_paths(module, names):
    import importlib

    m = importlib.import_module(module)
    assert [n for n in names.split() if not hasattr(m, n)] == []
