"""optimize_training.sh: variable validation, torchrun/restart command lines, allocator variables.

Most tests use the dry run (PLAINLOOP_DRY_RUN=1: print the exported variables and the command, run nothing);
a few put a fake `python` first on PATH to check what the real exec passes on. No training runs here: the
short real runs through the launcher live in tests/test_cli.py and tests/test_faults.py.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "optimize_training.sh"
LAUNCHER_VARS = (
    "TASK",
    "BATCH_SIZE",
    "NUM_WORKERS",
    "PRECISION",
    "COMPILE",
    "COMPILE_MODE",
    "EPOCHS",
    "DATA_PATH",
    "ERA5_DATA_PATH",
    "OUTPUT_DIR",
    "RUN_NAME",
    "SEED",
    "NPROC_PER_NODE",
    "NNODES",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MAX_RESTARTS",
    "SKIP_SETUP",
    "PLAINLOOP_DRY_RUN",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "SLURM_JOB_ID",
)


def launch(*args: str, dry: bool = True, path_prefix: Path | None = None, **env: str):
    e = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    e.update({"SKIP_SETUP": "1", "PLAINLOOP_DRY_RUN": "1" if dry else "0", **env})
    if path_prefix is not None:
        e["PATH"] = f"{path_prefix}:{e['PATH']}"
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=e, capture_output=True, text=True, timeout=60)


def parse(out: str) -> tuple[dict[str, str], list[str]]:
    """Dry-run stdout -> (exported variables, command argv)."""
    exports, cmd = {}, []
    for line in out.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            exports[name] = shlex.split(value)[0] if value else ""
        elif line.strip():
            assert not cmd, f"more than one command line:\n{out}"
            cmd = shlex.split(line)
    return exports, cmd


def flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_defaults_run_one_python_process():
    p = launch()
    assert p.returncode == 0, p.stderr
    exports, cmd = parse(p.stdout)
    # unset variables pass no flag: the CLI's defaults apply, and a resumed run keeps its saved settings
    assert cmd == ["python", "train_optimized.py"]
    assert exports == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    _, cmd = parse(launch(TASK="reid", PRECISION="32", OUTPUT_DIR="/o", SEED="0", COMPILE_MODE="max-autotune").stdout)
    assert cmd[2:] == ["--task", "reid", "--precision", "32", "--output_dir", "/o", "--seed", "0"]


@pytest.mark.parametrize(
    "name, value, allowed",
    [
        ("NPROC_PER_NODE", "two", ">= 1"),
        ("NPROC_PER_NODE", "0", ">= 1"),
        ("NNODES", "1.5", ">= 1"),
        ("NODE_RANK", "-1", ">= 0"),
        ("BATCH_SIZE", "32k", ">= 1"),
        ("BATCH_SIZE", "0", ">= 1"),
        ("NUM_WORKERS", "auto", ">= 0"),
        ("EPOCHS", " 5", ">= 1"),
        ("SEED", "4294967296", "<= 4294967295"),
        ("SEED", "abc", ">= 0"),
        ("MASTER_PORT", "70000", "<= 65535"),
        ("MASTER_PORT", "port", ">= 1"),
        ("MAX_RESTARTS", "many", ">= 0"),
        ("MAX_RESTARTS", "99999999999999999999", ">= 0"),
    ],
)
def test_bad_integer_variables_are_named_errors(name, value, allowed):
    p = launch(**{name: value})
    assert p.returncode == 2
    assert p.stdout == ""  # nothing ran, no command printed
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"optimize_training.sh: error: {name}=") and "whole number" in err and allowed in err
    assert value.strip() in err


def test_node_rank_must_be_below_nnodes():
    p = launch(NNODES="2", NODE_RANK="2")
    assert p.returncode == 2 and "NODE_RANK=2 is out of range" in p.stderr and "<= 1" in p.stderr
    assert launch(NNODES="2", NODE_RANK="1").returncode == 0


@pytest.mark.parametrize("name", ["COMPILE", "SKIP_SETUP", "PLAINLOOP_DRY_RUN"])
@pytest.mark.parametrize("value", ["2", "on", "y", "ja", "truee"])
def test_bad_boolean_variables_are_named_errors(name, value):
    p = launch(**{name: value})
    assert p.returncode == 2 and p.stdout == ""
    assert f"{name}='{value}' is not valid: use 1/0, true/false or yes/no" in p.stderr


@pytest.mark.parametrize(
    "value, on",
    [
        ("1", True),
        ("yes", True),
        ("YES", True),
        ("True", True),
        ("0", False),
        ("no", False),
        ("FALSE", False),
        ("", False),
    ],
)
def test_compile_accepts_yes_no_true_false(value, on):
    p = launch(COMPILE=value, COMPILE_MODE="max-autotune")
    assert p.returncode == 0, p.stderr
    _, cmd = parse(p.stdout)
    assert ("--compile_model" in cmd) is on
    assert (flag(cmd, "--compile_mode") == "max-autotune") is on
    _, cmd = parse(launch(COMPILE=value).stdout)
    assert "--compile_mode" not in cmd  # the CLI's default mode


def test_values_are_normalised_and_passed_through():
    p = launch(
        "--epochs",
        "7",
        "--lr",
        "3e-4",
        SEED="007",
        BATCH_SIZE="064",
        NUM_WORKERS="0",
        EPOCHS="3",
        DATA_PATH="/data dir/era5 sst.nc",
        TASK="reid",
        PRECISION="bf16-mixed",
        RUN_NAME="mine",
    )
    assert p.returncode == 0, p.stderr
    _, cmd = parse(p.stdout)
    assert (flag(cmd, "--seed"), flag(cmd, "--batch_size"), flag(cmd, "--num_workers")) == ("7", "64", "0")
    assert flag(cmd, "--data_path") == "/data dir/era5 sst.nc"  # one argument, spaces kept
    assert (flag(cmd, "--task"), flag(cmd, "--precision"), flag(cmd, "--run_name")) == (
        "reid",
        "bf16-mixed",
        "mine",
    )
    assert cmd[-4:] == ["--epochs", "7", "--lr", "3e-4"]  # extra arguments last: argparse lets them win
    assert "--resume" not in cmd  # a run name alone never resumes


def test_multi_process_uses_torchrun_on_a_free_port():
    p = launch(NPROC_PER_NODE="4")
    _, cmd = parse(p.stdout)
    assert cmd[0] == "python" and cmd[1].endswith("/trainer/cli/torchrun.py")  # torchrun's main, exit 128+N
    assert flag(cmd, "--nproc_per_node") == "4" and "--standalone" in cmd and "--master_port" not in cmd
    assert "--max_restarts" not in cmd
    assert cmd.index("train_optimized.py") > cmd.index("--standalone")


def test_explicit_master_and_multi_node_use_static_rendezvous():
    _, cmd = parse(launch(NPROC_PER_NODE="2", MASTER_PORT="29611").stdout)
    assert "--standalone" not in cmd and flag(cmd, "--master_port") == "29611"
    _, cmd = parse(launch(NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1", NPROC_PER_NODE="8").stdout)
    assert (flag(cmd, "--nnodes"), flag(cmd, "--node_rank"), flag(cmd, "--master_addr")) == (
        "2",
        "1",
        "10.0.0.1",
    )
    assert flag(cmd, "--master_port") == "29500" and "--standalone" not in cmd


def test_max_restarts_uses_torchrun_even_for_one_process_with_a_fixed_name_and_auto_resume():
    p = launch(MAX_RESTARTS="2", OUTPUT_DIR="/tmp/o")
    assert p.returncode == 0, p.stderr
    _, cmd = parse(p.stdout)
    assert cmd[0] == "python" and cmd[1].endswith("/trainer/cli/torchrun.py")  # torchrun's main, exit 128+N
    assert flag(cmd, "--max_restarts") == "2" and flag(cmd, "--nproc_per_node") == "1" and "--standalone" in cmd
    name = flag(cmd, "--run_name")
    assert name and name.startswith("era5-") and "/" not in name
    assert flag(cmd, "--resume") == "auto"
    assert f"/tmp/o/{name}" in p.stderr  # says where a restarted worker resumes
    _, again = parse(launch(MAX_RESTARTS="2").stdout)
    assert flag(again, "--run_name") != name  # a new launch is a new run
    _, cmd = parse(launch(MAX_RESTARTS="1", RUN_NAME="nightly").stdout)
    assert flag(cmd, "--run_name") == "nightly" and flag(cmd, "--resume") == "auto"


def test_restarts_give_each_attempt_a_fresh_rendezvous_store():
    exports, _ = parse(launch(MAX_RESTARTS="1").stdout)
    assert exports["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    exports, _ = parse(launch(MAX_RESTARTS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="0").stdout)
    assert exports["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"  # the user's setting wins
    exports, _ = parse(launch(NPROC_PER_NODE="2").stdout)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in exports  # without restarts nothing changes


def test_multi_node_restarts_need_one_name_on_every_node():
    p = launch(NNODES="2", MAX_RESTARTS="1", MASTER_ADDR="10.0.0.1")
    assert p.returncode == 2 and "RUN_NAME" in p.stderr and "every node" in p.stderr
    _, cmd = parse(launch(NNODES="2", MAX_RESTARTS="1", MASTER_ADDR="10.0.0.1", SLURM_JOB_ID="4242").stdout)
    assert flag(cmd, "--run_name") == "era5-slurm4242" and flag(cmd, "--rdzv_id") == "era5-slurm4242"
    assert flag(cmd, "--rdzv_backend") == "c10d" and flag(cmd, "--rdzv_endpoint") == "10.0.0.1:29500"


@pytest.mark.parametrize("name", ["a/b", ".", "..", "--help", "-x", "a\\b", "x" * 121, "a\nb", "a\x1bb"])
def test_run_name_must_be_a_plain_name(name):
    """The CLI's --run_name rule (trainer/config.py run_name_problem), checked before anything runs."""
    p = launch(RUN_NAME=name)
    assert p.returncode == 2 and "RUN_NAME" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not p.stdout


@pytest.mark.parametrize("name, value", [("TASK", "mnist"), ("PRECISION", "fp8"), ("COMPILE_MODE", "fast")])
def test_choice_variables_name_themselves(name, value):
    p = launch(**{name: value})
    assert p.returncode == 2 and f"{name}='{value}' is not valid: use one of" in p.stderr


def caller_launch(cwd: Path, *args: str, **env: str):
    e = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    e.update({"SKIP_SETUP": "1", "PLAINLOOP_DRY_RUN": "1", **env})
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=60)


def test_relative_paths_are_read_from_the_callers_directory(tmp_path):
    """The launcher runs from the repository; a relative OUTPUT_DIR, DATA_PATH or path flag still means the
    caller's directory (it used to land under the repository, and DATA_PATH=sst.nc was 'not found')."""
    (tmp_path / "sst.nc").write_bytes(b"")
    (tmp_path / "my.toml").write_text("", encoding="utf-8")
    p = caller_launch(
        tmp_path, "--config", "my.toml", "--cache_dir=cache", "--resume", "auto", OUTPUT_DIR="out", DATA_PATH="sst.nc"
    )
    assert p.returncode == 0, p.stderr
    _, cmd = parse(p.stdout)
    assert flag(cmd, "--output_dir") == str(tmp_path / "out")
    assert flag(cmd, "--data_path") == str(tmp_path / "sst.nc")
    assert flag(cmd, "--config") == str(tmp_path / "my.toml")
    assert flag(cmd, "--resume") == "auto" and f"--cache_dir={tmp_path / 'cache'}" in cmd
    # the script by its full path, so the re-run and resume lines the run prints work in the caller's directory
    assert str(ROOT / "train_optimized.py") in cmd and "train_optimized.py" not in cmd


def test_a_repository_input_still_works_from_elsewhere(tmp_path):
    """`--config configs/era5.toml` (as the examples write it) from another directory: the repository's file."""
    p = caller_launch(tmp_path, "--config", "configs/era5.toml")
    assert p.returncode == 0, p.stderr
    assert flag(parse(p.stdout)[1], "--config") == str(ROOT / "configs/era5.toml") and "repository" in p.stderr


# ------------------------------------------------------------------------------------------- allocator


@pytest.mark.parametrize(
    "env, expected, note",
    [
        ({}, {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, None),
        (
            {"PYTORCH_ALLOC_CONF": "max_split_size_mb:256"},
            {"PYTORCH_ALLOC_CONF": "max_split_size_mb:256"},
            None,
        ),
        ({"PYTORCH_ALLOC_CONF": ""}, {"PYTORCH_ALLOC_CONF": ""}, None),  # set empty: PyTorch's own default
        # seed 001's advice, the older name: the user's value is what PyTorch will read, under both names
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"},
            {
                "PYTORCH_ALLOC_CONF": "max_split_size_mb:128",
                "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
            },
            "your PYTORCH_CUDA_ALLOC_CONF='max_split_size_mb:128' is used",
        ),
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "a:1", "PYTORCH_ALLOC_CONF": "b:2"},
            {"PYTORCH_ALLOC_CONF": "b:2", "PYTORCH_CUDA_ALLOC_CONF": "a:1"},
            "PYTORCH_CUDA_ALLOC_CONF='a:1' is ignored",
        ),
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "c:3", "PYTORCH_ALLOC_CONF": "c:3"},
            {"PYTORCH_ALLOC_CONF": "c:3", "PYTORCH_CUDA_ALLOC_CONF": "c:3"},
            None,
        ),
    ],
)
def test_allocator_setting_of_the_user_wins(env, expected, note):
    p = launch(**env)
    assert p.returncode == 0, p.stderr
    exports, _ = parse(p.stdout)
    assert exports == expected
    assert "expandable_segments" not in p.stdout or not env
    if note:
        assert note in p.stderr
    else:
        assert "ALLOC_CONF" not in p.stderr


FAKE_PYTHON = """#!/usr/bin/env bash
echo "ALLOC=${PYTORCH_ALLOC_CONF-<unset>}"
echo "CUDA_ALLOC=${PYTORCH_CUDA_ALLOC_CONF-<unset>}"
for a in "$@"; do echo "ARG=$a"; done
exit "${FAKE_EXIT:-0}"
"""


@pytest.fixture()
def fake_python(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    for name in ("python", "python3"):
        (d / name).write_text(FAKE_PYTHON)
        (d / name).chmod(0o755)
    return d


def test_real_launch_execs_what_the_dry_run_prints(fake_python):
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "DATA_PATH": "/d d/x.nc", "COMPILE": "yes"}
    dry = launch("--epochs", "2", **env)
    real = launch("--epochs", "2", dry=False, path_prefix=fake_python, **env)
    assert real.returncode == 0, real.stderr
    lines = real.stdout.splitlines()
    assert lines[:2] == ["ALLOC=max_split_size_mb:128", "CUDA_ALLOC=max_split_size_mb:128"]
    argv = [ln[4:] for ln in lines if ln.startswith("ARG=")]
    assert argv == parse(dry.stdout)[1][1:]


def test_exit_code_of_the_training_process_is_the_launchers(fake_python):
    for code in ("0", "2", "3", "143"):
        assert launch(dry=False, path_prefix=fake_python, FAKE_EXIT=code).returncode == int(code)
    p = launch(dry=False, path_prefix=fake_python)
    assert "ALLOC=expandable_segments:True" in p.stdout and "CUDA_ALLOC=<unset>" in p.stdout
