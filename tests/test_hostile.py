"""Hostile input, property-based: every flag, config key and launcher variable fed values a hostile or unlucky user
would give (NaN, +-inf, negatives, zero, huge, empty, wrong type, paths that are directories, FIFOs, devices or
under a file, non-UTF-8). Whatever the value: exit 0/2 only, never a traceback; a refusal (exit 2) names the knob;
nothing is written outside the output directory and no run directory exists for a refused run; an accepted value
obeys its rule (finite, in range). Most examples drive the parser and `prepare` (every check before anything is
written) in-process; a few run the real CLI in a subprocess, and one trains on the accepted edge values.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import train_optimized as cli
from tests.helpers import SMALL
from trainer.config import check_value

ROOT = Path(__file__).resolve().parents[1]
RULES = cli.all_rules()
FLAGS = sorted(RULES)
KNOWN = cli.KNOWN_ERRORS

# strings as a shell passes them; <NAME> is replaced by a path of the arena below
HOSTILE_TEXT = [
    "nan", "NaN", "inf", "-inf", "+Infinity", "-1", "0", "-0", "1e308", "1e400", "-1e308", "99999999999999999999999",
    "4294967296", "2147483648", "", " ", "abc", "1.5", "2.5e3", "0x10", "1_000", "true", "none", "auto",
    "\udcff\udcfe", "a\x00b", "tab\there", "../../escape", "/", ".", "..", "-", "--help", "x" * 300,
    "<DIR>", "<FIFO>", "/dev/zero", "/dev/null", "<FILE>", "<UNDER_FILE>", "<NON_UTF8_FILE>", "<EMPTY_FILE>",
]  # fmt: skip
# typed values as a config file or a Python dict gives them
HOSTILE_TYPED = [
    float("nan"), float("inf"), -float("inf"), -1, 0, -1.5, 0.5, 2**63 - 1, 10**30, 1e308, -(2**70), "", "nan",
    "1e400", [], [1, 2], [float("nan"), 1.0], {"a": 1}, True, False, None, "\udcff", "../x", "<DIR>", "<FIFO>",
]  # fmt: skip


@pytest.fixture(scope="module")
def arena(tmp_path_factory) -> dict[str, Path]:
    """Paths of every awkward kind, made once."""
    root = tmp_path_factory.mktemp("arena")
    (root / "dir").mkdir()
    (root / "file").write_text("not a directory", encoding="utf-8")
    (root / "empty.toml").write_bytes(b"")
    bad = root / "latin1.toml"
    bad.write_bytes(b"[train]\nrun_name = '\xe9t\xe9'\n")
    os.mkfifo(root / "fifo")
    return {
        "<DIR>": root / "dir",
        "<FIFO>": root / "fifo",
        "<FILE>": root / "file",
        "<UNDER_FILE>": root / "file" / "sub",
        "<NON_UTF8_FILE>": bad,
        "<EMPTY_FILE>": root / "empty.toml",
    }


def _sub(v: Any, arena: dict[str, Path]) -> Any:
    return str(arena[v]) if isinstance(v, str) and v in arena else v


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _names_knob(text: str, knob: str) -> bool:
    return knob in text


def _accepted_values_obey_their_rules(values: dict[str, Any]) -> None:
    for k, v in values.items():
        if k in RULES:
            tp, rule = RULES[k]
            assert check_value(k, v, tp, rule) == v  # idempotent: what was accepted passes its rule again
            for x in v if isinstance(v, tuple) else (v,):
                if isinstance(x, float) and not rule.get("allow_inf"):
                    assert math.isfinite(x), (k, v)


def _prepare(argv: list[str], out: Path) -> tuple[int, str]:
    """Parse + every check before anything is written, in-process; (exit code main would give, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            explicit = vars(cli.build_parser().parse_args([*argv, "--output_dir", str(out)]))
        except SystemExit as e:
            return int(e.code or 0), err.getvalue()
        try:
            opts, task_kw, train_kw = cli.prepare(explicit, [])
        except KNOWN as e:
            return 2, f"error: {e}"
    _accepted_values_obey_their_rules({**task_kw, **train_kw})
    return 0, ""


def _check_outcome(code: int, err: str, knob: str, tmp: Path, before: set[str]) -> None:
    assert code in (0, 2), (knob, code, err)
    assert "Traceback" not in err
    if code == 2:
        first = err.strip().splitlines()[0] if err.strip() else ""
        assert _names_knob(first, knob) or knob in ("config", "resume"), (knob, err)
    assert _listing(tmp) == before, f"{knob}: files written during the checks: {_listing(tmp) - before}"


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(knob=st.sampled_from(FLAGS), value=st.sampled_from(HOSTILE_TEXT))
def test_every_flag_with_hostile_text(knob, value, arena, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flag")
    before = _listing(tmp)
    tp, _ = RULES[knob]
    if tp is bool or str(tp) in ("bool",):
        argv = [f"--{knob}={_sub(value, arena)}"]  # a switch takes no value: argparse refuses, naming it
    else:
        argv = [f"--{knob}", str(_sub(value, arena))]
    code, err = _prepare(argv, tmp / "out")
    # a config file or resume target that is a bad file is named by its path, and the flag by argparse
    _check_outcome(code, err, knob if knob not in ("config", "resume") else knob, tmp, before)
    assert not (tmp / "out").exists() or not any((tmp / "out").iterdir()), "a run directory before any training"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    knob=st.sampled_from([k for k in FLAGS if k not in cli.NOT_IN_CONFIG_FILE]), value=st.sampled_from(HOSTILE_TYPED)
)
@pytest.mark.slow
def test_every_config_key_with_hostile_values(knob, value, arena, tmp_path_factory):
    """A --config file (JSON holds NaN, Infinity and huge integers; TOML cannot) with one hostile value."""
    tmp = tmp_path_factory.mktemp("cfg")
    f = tmp / "run.json"
    f.write_text(json.dumps({knob: _sub(value, arena)}), encoding="utf-8")
    before = _listing(tmp)
    code, err = _prepare(["--config", str(f)], tmp / "out")
    # a table name ([task], [run], [train]) holding a dict is a table: its unknown key is the one named
    named = "'a'" if isinstance(value, dict) and knob in ("task", "run", "train") else knob
    _check_outcome(code, err, named, tmp, before)


WORST = ["nan", "-inf", "-1", "0", "1e400", "99999999999999999999999", "", "\udcff", "x" * 300, "<FIFO>",
         "<UNDER_FILE>", "/dev/zero"]  # fmt: skip


@pytest.mark.parametrize("knob", FLAGS)
def test_every_flag_with_the_worst_values(knob, arena, tmp_path):
    """The same property for every flag and a fixed set of the worst values: none of these is left to chance."""
    tp, _ = RULES[knob]
    for i, value in enumerate(WORST):
        tmp = tmp_path / str(i)
        tmp.mkdir()
        v = str(_sub(value, arena))
        code, err = _prepare([f"--{knob}={v}"] if tp is bool else [f"--{knob}", v], tmp / "out")
        _check_outcome(code, err, knob, tmp, set())


@settings(max_examples=200, deadline=None)
@given(
    knob=st.sampled_from(sorted(cli.rules()["train"])),
    value=st.sampled_from([v for v in HOSTILE_TYPED if not (isinstance(v, str) and v.startswith("<"))]),
)
def test_every_trainer_params_key_with_hostile_values(knob, value):
    """BaseTrainer's door: TrainConfig.from_dict (what base.py calls) converts and checks with the same rules."""
    from trainer import TrainConfig
    from trainer.config import ConfigError

    try:
        cfg = TrainConfig.from_dict({knob: value}, where="trainer_params")
    except ConfigError as e:
        assert f"trainer_params: {knob}" in str(e) and "\n" not in str(e)
        return
    _accepted_values_obey_their_rules({knob: getattr(cfg, knob)})


LAUNCHER_VARS = ["TASK", "BATCH_SIZE", "NUM_WORKERS", "PRECISION", "COMPILE", "COMPILE_MODE", "EPOCHS", "OUTPUT_DIR",
                 "RUN_NAME", "SEED", "NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_PORT", "MAX_RESTARTS",
                 "SKIP_SETUP", "DATA_PATH"]  # fmt: skip
LAUNCHER_TEXT = [v for v in HOSTILE_TEXT if "\x00" not in v] + [  # an environment cannot hold a NUL
    "-5", "08", "1 2", "$(touch pwned)", "`touch pwned`", "a;b", "99999999999999999999",
]  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(var=st.sampled_from(LAUNCHER_VARS), value=st.sampled_from(LAUNCHER_TEXT))
def test_every_launcher_variable_with_hostile_values(var, value, arena, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sh")
    value = _sub(value, arena)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS + ["ERA5_DATA_PATH", "MASTER_ADDR"]}
    env.update({"SKIP_SETUP": "1", "PLAINLOOP_DRY_RUN": "1", var: value})  # non-UTF-8 text goes as its raw bytes
    p = subprocess.run(["bash", str(ROOT / "optimize_training.sh")], cwd=tmp, env=env, capture_output=True, timeout=600)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode in (0, 2), (var, value, err)
    assert "Traceback" not in err and "unbound variable" not in err and "syntax error" not in err
    if p.returncode == 2:
        assert var in err.splitlines()[0], err
    assert not (tmp / "pwned").exists() and not list(tmp.iterdir())


# ------------------------------------------------------------------------------------------- the real CLI
def _real(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(ROOT / "train_optimized.py"), *argv], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600, errors="replace",  # the timeout only catches a hang
    )  # fmt: skip


REFUSED = [
    (["--lr", "nan"], "--lr"),
    (["--run_name", "../../escape"], "--run_name"),
    (["--config", "<NON_UTF8_FILE>"], "latin1.toml"),
    (["--weight_decay", "-5"], "--weight_decay"),
    (["--min_lr_ratio", "-3"], "--min_lr_ratio"),
    (["--warmup_steps", "-5"], "--warmup_steps"),
    (["--seed", "-1"], "--seed"),
    (["--data_path", "<FIFO>"], "--data_path"),
    (["--data_path", "/dev/zero"], "--data_path"),
    (["--output_dir", "<UNDER_FILE>"], "--output_dir"),
    (["--output_dir", "<FILE>"], "--output_dir"),
    (["--cache_dir", "<FILE>"], "--cache_dir"),
    (["--config", "<DIR>"], "is a directory"),
    (["--device", "bogus"], "--device"),
    (["--run_name", "x" * 300], "--run_name"),
    (["--task", "reid", "--margin", "nan"], "--margin"),
    (["--task", "reid", "--image_size", "0", "0"], "--image_size"),
    (["--task", "reid", "--eval_workers", "-2"], "--eval_workers"),
]


def _refused_checks(code: int, err: str, knob: str, tmp_path: Path, cwd: Path, out: Path) -> None:
    assert code == 2, err
    assert "Traceback" not in err and knob in err.splitlines()[0], err
    assert len(err.strip().splitlines()) <= 2
    assert not out.exists() or not any(out.iterdir()), "a run directory for a refused run"
    assert not any(cwd.iterdir()) and sorted(p.name for p in tmp_path.iterdir()) == ["cwd", *(["out"] * out.exists())]


def _argv(argv: list[str], arena: dict[str, Path], out: Path) -> list[str]:
    argv = [str(_sub(a, arena)) for a in argv]
    return argv if "--output_dir" in argv else [*argv, "--output_dir", str(out)]


@pytest.mark.slow
@pytest.mark.parametrize("argv, knob", REFUSED[:3])
def test_real_cli_refuses_with_one_line_and_writes_nothing(argv, knob, arena, tmp_path):
    """In a subprocess, as a user runs it: the exit code, stderr and the file system are what a user sees."""
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    p = _real(_argv(argv, arena, out), cwd)
    _refused_checks(p.returncode, p.stderr, knob, tmp_path, cwd, out)


@pytest.mark.parametrize("argv, knob", REFUSED[3:])
def test_cli_main_refuses_with_one_line_and_writes_nothing(argv, knob, arena, tmp_path, monkeypatch, capsys):
    """The same checks through cli.main in-process (torch is imported once for all of them)."""
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    try:
        code = cli.main(_argv(argv, arena, out))
    except SystemExit as e:
        code = int(e.code or 0)
    _refused_checks(code, capsys.readouterr().err, knob, tmp_path, cwd, out)


def test_edge_values_that_are_allowed_train_finite_weights(tmp_path, era5_cache, monkeypatch):
    """The accepted ends of the ranges (no weight decay, a schedule to zero, no warm-up, a tiny lr) train and
    write only finite weights, inside the output directory."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    argv = ["--max_steps", "2", "--weight_decay", "0", "--min_lr_ratio", "0", "--warmup_steps", "0", "--lr", "1e-12"]
    assert cli.main([*argv, "--output_dir", str(out), "--run_name", "edge", "--seed", "0", *SMALL]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    ckpt = torch.load(out / "edge" / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values() if t.is_floating_point())


# ------------------------------------------------------------------------------------------- the engine's side
def _toy_task(bad_steps: set[int]):
    """A regression task whose loss is NaN at the given calls while its gradients stay finite (relu(nan) has
    gradient 0): re-ID's `--margin nan` did exactly this, and trained NaN losses with 0 skipped steps."""
    from torch import nn
    from torch.utils.data import TensorDataset

    from trainer import Task

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    calls = [0]

    def loss_fn(m, batch):
        xb, yb = batch
        calls[0] += 1
        loss = ((m(xb) - yb) ** 2).mean()
        return loss + torch.relu(torch.tensor(float("nan"))) if calls[0] in bad_steps else loss

    return Task("toy", model, TensorDataset(x, x.sum(1, keepdim=True)), loss_fn=loss_fn)


def test_a_nan_loss_with_finite_gradients_is_a_skipped_step_and_metrics_stay_strict_json(tmp_path):
    from tests.helpers import toy_config
    from trainer import Trainer

    cfg = toy_config(tmp_path, epochs=1, batch_size=8, log_every=1, validation_interval=1)
    t = Trainer(cfg, _toy_task({3}))
    summary = t.fit()
    assert summary["skipped_steps"] == 1
    rows = [json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
            for line in (t.run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]  # fmt: skip
    bad = [r for r in rows if r.get("nonfinite")]
    assert bad and all(r[k] is None for r in bad for k in r["nonfinite"])
    ckpt = torch.load(t.run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    json.loads((t.run_dir / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(c))


def test_a_claimed_directory_is_never_shared_and_a_live_run_is_never_resumed(tmp_path):
    """A directory another launch has created but not yet locked and marked is never taken (it was: a 9 ms
    window); one a live process holds is skipped by --resume auto."""
    from trainer.runfiles import claim_run_dir, find_resumable

    (tmp_path / "same").mkdir()  # another launch's mkdir, before its lock and mark
    run, note = claim_run_dir(tmp_path, "same", "era5")
    assert run.name == "same-2" and note and not any((tmp_path / "same").iterdir())
    from trainer.checkpoint import atomic_save

    live = tmp_path / "era5-live"
    atomic_save({"model": {"w": torch.zeros(1)}, "step": 1}, live / "checkpoints" / "last.pt")
    (live / ".plainloop-run").write_text("1\n")
    holder = subprocess.Popen(  # the run's lock is an flock on its directory; held until the test kills it
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()", str(live)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert find_resumable(tmp_path, "era5") is None
        again, _ = claim_run_dir(tmp_path, "era5-live", "era5")
        assert again.name == "era5-live-2"
    finally:
        holder.kill()
        holder.wait()
    assert find_resumable(tmp_path, "era5") == live


@pytest.mark.slow
def test_resume_reads_the_settings_from_the_checkpoint_when_config_toml_is_empty(tmp_path, era5_cache, capsys):
    """config.toml truncated (a kill or a bad value mid-write, in the old code): `--resume RUN_DIR` said the weights
    did not fit, or resumed with default sizes and crashed. Every checkpoint now carries the run's settings."""
    argv = ["--max_steps", "6", "--checkpoint_every", "2", "--batch_size", "16", "--d_model", "48"]
    assert cli.main([*argv, "--output_dir", str(tmp_path), "--run_name", "r", *SMALL]) == 0
    run = tmp_path / "r"
    (run / "config.toml").write_bytes(b"")
    capsys.readouterr()
    assert cli.main(["--resume", str(run), "--max_steps", "8"]) == 0
    out = capsys.readouterr().out
    assert "read from its checkpoint" in out and "done: 8 steps" in out
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["effective"]["batch_size"] == 16


def test_a_stop_right_after_the_run_directory_is_made_saves_and_resumes(tmp_path):
    """SIGTERM between config.json and the first step printed "last.pt written" and wrote none: the stop handler
    now covers the run directory's first file, and a stop before the first step saves the starting weights."""
    import os
    import signal

    from torch.utils.data import TensorDataset

    from tests.helpers import toy_config
    from trainer import Task, Trainer
    from trainer.finish import TrainingStopped

    class StopAtStart:
        def on_fit_start(self, trainer):
            os.kill(os.getpid(), signal.SIGTERM)

    x = torch.randn(64, 4)
    task = Task("toy", torch.nn.Linear(4, 1), TensorDataset(x, x.sum(1, keepdim=True)))
    with pytest.raises(TrainingStopped) as e:
        Trainer(toy_config(tmp_path, epochs=1, batch_size=8), task, callbacks=[StopAtStart()]).fit()
    assert e.value.code == 143 and (tmp_path / "run" / "checkpoints" / "last.pt").is_file()


def test_a_killed_settings_write_leaves_a_temp_the_next_start_removes(tmp_path):
    """config.toml's temp file is named as checkpoint temps are, so a writer killed mid-write is tidied up."""
    from trainer.checkpoint import atomic_write_text, remove_orphan_temps
    from trainer.support.files import _owner_tag

    atomic_write_text(tmp_path / "config.toml", "x = 1\n")
    dead = 2**22 + 12345  # above pid_max's default: no such process
    host = _owner_tag().split("~")[0]  # this host, as writers name it
    (tmp_path / f".config.toml.{host}~{dead}.abc123.tmp").write_text("half")
    removed = remove_orphan_temps(tmp_path)
    assert len(removed) == 1 and [p.name for p in tmp_path.iterdir()] == ["config.toml"]
