"""train_optimized.py and optimize_training.sh: flags, errors, and short real runs on the sample data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train_optimized as cli
from tests.helpers import SMALL
from trainer import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def settings(argv: list[str]) -> tuple:
    explicit = vars(cli.build_parser().parse_args(argv))
    return cli.split_settings(cli.resolve_settings(explicit, []))


def exit_code(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


def test_seed001_command_line_parses():
    _, _, train_kw = settings(
        ["--batch_size", "8", "--num_workers", "16", "--compile_model", "--validation_interval", "20"]
    )
    cfg = TrainConfig(**train_kw)
    assert (cfg.batch_size, cfg.num_workers, cfg.compile_model, cfg.validation_interval) == (8, 16, True, 20)


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["--batch_sise", "8"], "(--batch_sise: did you mean --batch_size?)"),
        (["--batch_sise=8"], "(--batch_sise: did you mean --batch_size?)"),
        (["--valdation_interval", "2"], "(--valdation_interval: did you mean --validation_interval?)"),
        (["--no-progres_bar"], "(--no-progres_bar: did you mean --no-progress_bar?)"),
        (["--zzzqqq", "1"], None),  # nothing near: no guess
    ],
)
def test_a_misspelt_flag_gets_did_you_mean(argv, hint, capsys):
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "unrecognized arguments" in err
    assert (hint in err) if hint else "did you mean" not in err


def test_a_misspelt_config_key_gets_did_you_mean(tmp_path, capsys):
    (tmp_path / "c.toml").write_text("[train]\nbatch_sise = 8\n")
    assert exit_code(["--config", str(tmp_path / "c.toml")]) == 2
    err = capsys.readouterr().err
    assert "unknown setting(s) 'batch_sise' (did you mean batch_size" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--precision", "fp8"], "--precision: fp8: not allowed; use one of auto, 32, 16-mixed, bf16-mixed"),
        (["--batch_size", "0"], "--batch_size: 0: out of range; use a whole number >= 1"),
        (["--loss_scale", "huge"], "use 'dynamic' or a positive number"),
        (["--compile_mode", "fast"], "--compile_mode: fast: not allowed; use one of default"),
        (["--lat", "10", "-10"], "S < N"),
        (["--lat", "100", "120"], "--lat 100 120: S N must each lie in [-90, 90] degrees"),  # not Area's lat=
        (["--lon", "-200", "10"], "--lon -200 10: W E must each lie in [-180, 360] degrees"),
        (["--min_lr_ratio", "x"], "--min_lr_ratio: x: not a finite number; use a finite number in [0, 1]"),
    ],
)
def test_bad_values_are_clear_errors_with_exit_2(argv, message, capsys):
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    lines = err.strip().splitlines()  # one line naming the flag (+ the --debug hint), not argparse's usage block
    assert len(lines) <= 2 and "usage:" not in err and lines[0].startswith(("train_optimized.py: error:", "error:"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch_size", "30"], "--batch_size 30 is not divisible by --num_instances 4"),
        (["--batch_size", "30", "--num_instances", "4"], "e.g. --batch_size 28 or 32"),
        (["--batch_size", "10", "--num_instances", "3"], "--batch_size 10 is not divisible by --num_instances 3"),
    ],
)
def test_reid_pk_batch_is_checked_with_flag_names(argv, message, capsys, monkeypatch):
    """The sampler's error said "batch_size=30 is not divisible by num_instances=4" (its keywords), after the data
    was read; the CLI checks first and names the flags."""
    import tasks.reid

    def not_yet(*_a, **_kw):
        raise AssertionError("the data was read before the P x K batch was checked")

    monkeypatch.setattr(tasks.reid, "synthetic_reid", not_yet)
    assert exit_code(["--task", "reid", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "batch_size=" not in err and "num_instances=" not in err, err
    assert len(err.strip().splitlines()) <= 2


def test_preset_line_counts_layers_and_recursions_in_words():
    _, note = cli.resolve_task_args("era5", {}, "cpu", on_gpu=False)  # the CPU preset: one layer, two recursions
    assert "1 layer x 2 recursions" in note
    _, note = cli.resolve_task_args("era5", {"num_layers": 3, "recursion_depth": 1}, "cpu", on_gpu=False)
    assert "3 layers x 1 recursion)" in note


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help", "logging"])
    out = capsys.readouterr().out
    assert "(default: 100)" in out and "(default: 200)" in out and "LOG_EVERY" in out


@pytest.mark.slow
def test_era5_run_writes_scores(tmp_path, era5_cache, capsys):
    assert cli.main(["--epochs", "2", "--output_dir", str(tmp_path), "--run_name", "r", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "persistence" in out and "climatology" in out and "preset: cpu" in out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for name in ("model", "persistence", "climatology", "anomaly_persistence"):
        assert summary["test_scores"][name]["rmse"] > 0
    assert (tmp_path / "r" / "test_month.npz").is_file()


def test_baseline_flag_runs_the_before_loop(tmp_path, era5_cache):
    assert cli.main(["--baseline", "--max_steps", "3", "--output_dir", str(tmp_path), "--run_name", "b", *SMALL]) == 0
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    eff = cfg["effective"]
    assert (eff["precision"], eff["num_workers"], eff["pin_memory"], eff["log_every"]) == ("32", 0, False, 1)
    rows = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert sum('"train"' in r for r in rows) == 3  # the loss is read every step, as the seeds did


@pytest.mark.slow
def test_resume_flag_continues_a_run(tmp_path, era5_cache):
    common = ["--output_dir", str(tmp_path), "--run_name", "c", *SMALL]
    assert cli.main(["--epochs", "1", *common]) == 0
    assert cli.main(["--epochs", "2", "--resume", str(tmp_path / "c"), *common]) == 0
    s = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert s["epochs"] == 2 and any("resume:" in n for n in s["notes"])


def run_launcher(tmp_path: Path, *args: str, **env: str) -> None:
    """optimize_training.sh for real: SKIP_SETUP=1, OUTPUT_DIR=tmp_path, this Python first on PATH; must exit 0."""
    env = {
        **os.environ,
        "SKIP_SETUP": "1",
        **env,
        "OUTPUT_DIR": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "optimize_training.sh"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_shell_launcher_passes_env_and_arguments(tmp_path, era5_cache):
    run_launcher(tmp_path, "--run_name", "sh", "--max_steps", "2", *SMALL, BATCH_SIZE="8", EPOCHS="1")
    cfg = json.loads((tmp_path / "sh" / "config.json").read_text())["effective"]
    assert cfg["batch_size"] == 8 and cfg["max_steps"] == 2


@pytest.mark.slow
def test_profile_and_auto_batch_size(tmp_path, era5_cache, capsys):
    assert (
        cli.main(
            [
                "--profile",
                "--auto_batch_size",
                "--max_steps",
                "2",
                "--output_dir",
                str(tmp_path),
                "--run_name",
                "p",
                *SMALL,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "auto_batch_size:" in out
    trace = tmp_path / "p" / "profile" / "trace.json"
    assert json.loads(trace.read_text())["traceEvents"]  # a Chrome trace with events
    assert "|" in (tmp_path / "p" / "profile" / "profile_top_ops.md").read_text()
    assert not (tmp_path / "p" / "checkpoints").exists()  # profiled, then stopped: no training
    assert "profiled only, nothing trained (add --profile_then_train" in out  # the console said nothing of it
    assert "USDT" not in out


def test_profile_then_train_names_its_own_profiling_pass(tmp_path, capsys):
    """--profile --profile_then_train said "reusing RUN (an earlier start left no checkpoint...)": the earlier start
    was its own profiling pass."""
    args = ["--task", "reid", "--num_identities", "24", "--max_steps", "2", "--no-progress_bar", "--no-plots"]
    run = ["--profile", "--profile_then_train", "--output_dir", str(tmp_path), "--run_name", "p"]
    assert cli.main([*args, *run]) == 0
    out = capsys.readouterr().out
    assert "earlier start" not in out and "holds the profiler's trace, profile/, and no checkpoint" in out
    assert (tmp_path / "p" / "profile" / "trace.json").is_file() and (tmp_path / "p" / "summary.json").is_file()


@pytest.mark.slow
def test_tensorboard_logger_writes_events_into_the_run_dir(tmp_path, era5_cache):
    assert (
        cli.main(
            [
                "--logger",
                "tensorboard",
                "--max_steps",
                "2",
                "--output_dir",
                str(tmp_path),
                "--run_name",
                "tb",
                *SMALL,
            ]
        )
        == 0
    )
    assert list((tmp_path / "tb").glob("events.out.tfevents.*")), "in RUN_DIR itself: --logdir OUTPUT_DIR names runs"
    helps = {a.dest: a.help for a in cli.build_parser()._actions}
    assert "RUN_DIR/tb" not in helps["logger"] and "events in RUN_DIR" in helps["logger"]  # the help said RUN_DIR/tb


@pytest.mark.slow
def test_system_report_writes_markdown(tmp_path, era5_cache, capsys):
    assert (
        cli.main(
            [
                "--system_report",
                "--report_steps",
                "3",
                "--report_repeats",
                "1",
                "--output_dir",
                str(tmp_path),
                "--run_name",
                "s",
                *SMALL,
            ]
        )
        == 0
    )
    text = (tmp_path / "s" / "report.md").read_text()
    assert "## Verdict" in text and "your settings" in text and "## Hardware" in text
    assert "precision=bf16-mixed" in text  # measured on a CPU too (whether it wins depends on the CPU)


def test_reid_task_runs(tmp_path, capsys):
    assert (
        cli.main(
            [
                "--task",
                "reid",
                "--num_identities",
                "24",
                "--max_steps",
                "4",
                "--output_dir",
                str(tmp_path),
                "--run_name",
                "reid",
                "--no-progress_bar",
                "--no-plots",
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "reid" / "summary.json").read_text())
    assert 0 <= summary["final_metrics"]["test_rgb2ir_mAP"] <= 1 and summary["steps"] == 4


def test_closing_lines_show_the_tasks_console_metrics(tmp_path, capsys):
    """SYSU-MM01 printed "val_allsearch_trials: 10.0000" among the scores: the number of gallery draws is no score."""
    final = {
        "val_allsearch_mAP": 0.5,
        "val_allsearch_trials": 10.0,
        "test_allsearch_mAP": 0.4,
        "test_allsearch_trials": 10.0,
    }
    summary = {"steps": 4, "train_time_s": 1.0, "samples_per_s": 100.0, "final_metrics": final}
    opts = cli.RunOptions(plots=False)
    cli.report_run(summary, tmp_path, opts, ("val_allsearch_mAP", "test_allsearch_mAP"))
    out = capsys.readouterr().out
    assert "val_allsearch_mAP: 0.5000" in out and "test_allsearch_mAP: 0.4000" in out
    assert "_trials" not in out and "(+2 more in summary.json)" in out
    cli.report_run(summary, tmp_path, opts)  # a task without console_metrics: every metric
    assert "val_allsearch_trials: 10.0000" in capsys.readouterr().out


def test_rerun_line_keeps_the_torchrun_prefix():
    """Under torchrun the final line said "re-run: python train_optimized.py --config ...", which runs one process."""
    cfg = Path("runs/r/config.toml")
    assert cli.rerun_command(cfg, {}) == f"python train_optimized.py --config {cfg}"
    assert cli.rerun_command(cfg, {"WORLD_SIZE": "1"}) == f"python train_optimized.py --config {cfg}"
    two = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert cli.rerun_command(cfg, two) == f"torchrun --standalone --nproc_per_node 2 train_optimized.py --config {cfg}"
    assert cli.rerun_command(cfg, {"WORLD_SIZE": "4"}).startswith("torchrun --standalone --nproc_per_node 4 ")
    nodes = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "node0", "MASTER_PORT": "29400"}
    assert cli.rerun_command(cfg, nodes) == (
        "torchrun --nnodes 2 --node_rank NODE_RANK --nproc_per_node 8 --master_addr node0 --master_port 29400 "
        f"train_optimized.py --config {cfg} (on each node)"
    )


@pytest.mark.slow
def test_shell_launcher_reid_task(tmp_path):
    args = ("--run_name", "r", "--max_steps", "2", "--num_identities", "24", "--no-progress_bar", "--no-plots")
    run_launcher(tmp_path, *args, TASK="reid")
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["task"] == "reid"


@pytest.mark.slow
def test_resume_run_dir_alone_restores_the_runs_settings(tmp_path, era5_cache, capsys):
    """Non-default model sizes and schedule: `--resume RUN_DIR` with no other flag continues the same job."""
    assert (
        cli.main(
            [
                "--epochs",
                "2",
                "--max_steps",
                "6",
                "--batch_size",
                "16",
                "--output_dir",
                str(tmp_path),
                "--run_name",
                "sizes",
                *SMALL,
            ]
        )
        == 0
    )
    first = torch.load(tmp_path / "sizes" / "checkpoints" / "last.pt", weights_only=True)
    assert first["step"] == 6
    capsys.readouterr()
    assert exit_code(["--resume", str(tmp_path / "sizes"), "--max_steps", "9"]) == 0
    out = capsys.readouterr().out
    assert "resume: max_steps 6 -> 9 (given now)" in out and "now has 9 optimizer steps (was 6)" in out
    assert "done: 9 steps (3 since the resume) in " in out  # the time and samples/s are this process's
    s = json.loads((tmp_path / "sizes" / "summary.json").read_text())
    assert s["steps_this_process"] == 3
    assert (
        s["steps"] == 9
        and json.loads((tmp_path / "sizes" / "config.json").read_text())["effective"]["batch_size"] == 16
    )
    # a change the weights cannot follow is refused before anything is built, naming both values
    assert exit_code(["--resume", str(tmp_path / "sizes"), "--max_steps", "12", "--d_model", "64"]) == 2
    err = capsys.readouterr().err
    assert "--d_model 64: the run at" in err and "made with d_model 32" in err and "Traceback" not in err


@pytest.mark.slow
def test_resume_auto_continues_the_named_run_or_starts_it(tmp_path, era5_cache):
    common = ["--output_dir", str(tmp_path), "--run_name", "auto", "--resume", "auto", *SMALL]
    assert cli.main(["--max_steps", "3", *common]) == 0  # nothing to resume: starts it
    assert cli.main(["--max_steps", "5", *common]) == 0  # continues it
    s = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert s["steps"] == 5 and any("resume:" in n for n in s["notes"])
    assert not (tmp_path / "auto-2").exists()


@pytest.mark.slow
def test_resume_auto_skips_finished_runs(tmp_path, era5_cache, capsys):
    """Without --run_name, auto continues the newest run that still has steps left, not the newest finished one."""
    common = ["--output_dir", str(tmp_path), "--max_steps", "2", *SMALL]
    assert cli.main(["--run_name", "era5-killed", *common]) == 0
    (tmp_path / "era5-killed" / "summary.json").unlink()  # as kill -9 leaves it: a checkpoint, no summary
    assert cli.main(["--run_name", "era5-done", *common]) == 0  # newer, finished
    capsys.readouterr()
    assert exit_code(["--output_dir", str(tmp_path), "--resume", "auto", "--max_steps", "3"]) == 0
    assert json.loads((tmp_path / "era5-killed" / "summary.json").read_text())["steps"] == 3
    assert json.loads((tmp_path / "era5-done" / "summary.json").read_text())["steps"] == 2
    # everything finished: auto starts a new run and says so
    assert exit_code(["--output_dir", str(tmp_path), "--resume", "auto", "--max_steps", "2", *SMALL]) == 0
    assert "resume auto: nothing to resume under" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--data_path", "/nonexistent/sst.nc"],
            "--data_path /nonexistent/sst.nc: ERA5 data file not found; give --data_path",
        ),
        (
            ["--data_path", "/nonexistent/*.nc"],
            "--data_path '/nonexistent/*.nc': the glob matches no file; give --data_path",
        ),
        (["--resume", "/nonexistent/run"], "--resume /nonexistent/run: no such checkpoint or run directory"),
        (["--config", "/nonexistent.toml"], "--config /nonexistent.toml: no such file"),
    ],
)
def test_known_errors_are_one_line_with_exit_2(argv, message, capsys, tmp_path, era5_cache):
    assert exit_code([*argv, "--output_dir", str(tmp_path), *SMALL]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) <= 3
    assert "data_path=" not in err  # the library's keyword; a CLI user types --data_path


def test_corrupt_checkpoint_is_a_clear_error(tmp_path, era5_cache, capsys):
    assert cli.main(["--max_steps", "2", "--output_dir", str(tmp_path), "--run_name", "c", *SMALL]) == 0
    (tmp_path / "c" / "checkpoints" / "last.pt").write_bytes(os.urandom(4096))
    assert exit_code(["--resume", str(tmp_path / "c"), "--max_steps", "4"]) == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and "last.pt" in err and "Traceback" not in err


def _lit_run(where: Path) -> None:
    """A run of another task, made from Python (its checkpoint carries no command-line task)."""
    from torch import nn
    from torch.utils.data import TensorDataset

    from tests.helpers import toy_config
    from trainer import Task, Trainer

    x = torch.randn(16, 4)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    Trainer(
        toy_config(where.parent, run_name=where.name, epochs=1, batch_size=8), Task("lit", nn.Linear(4, 1), data)
    ).fit()


@pytest.mark.parametrize(
    "target, words",
    [
        ("junk.pt", "junk.pt is corrupt or truncated and cannot be read"),
        ("tensor.pt", "tensor.pt is not a plainloop checkpoint (a Tensor); resume from a run directory"),
        (
            "dict.pt",
            "dict.pt is not a plainloop checkpoint (no 'model' entry; keys: ['a']); resume from a run directory",
        ),
        ("empty", "empty is not a run directory (EMPTY/checkpoints/last.pt does not exist); pass a run directory"),
        ("lit", "is a checkpoint of task 'lit', not 'era5' (the task this resume builds); to continue it, give --task"),
    ],
)
def test_a_bad_resume_target_is_said_first_and_alone(target, words, tmp_path, capsys):
    """A junk file, a random .pt, a dict .pt, an empty directory or another task's run: the error came after a
    misleading "config.toml is missing" note and the data loading; it is now the one line, before any of it."""
    (tmp_path / "junk.pt").write_bytes(os.urandom(4096))
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    torch.save({"a": 1}, tmp_path / "dict.pt")
    (tmp_path / "empty").mkdir()
    _lit_run(tmp_path / "lit")
    capsys.readouterr()
    assert exit_code(["--resume", str(tmp_path / target), "--output_dir", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not (tmp_path / "out").exists()  # no note, no data line, no run directory
    assert err.startswith("error: ") and err.count("\n") == 2, err  # the line and the --debug hint
    assert words.replace("EMPTY", str(tmp_path / "empty")) in err


def test_a_large_checkpoint_is_checked_without_reading_its_tensors(tmp_path):
    """The check before set-up reads a large file's entries memory-mapped (no tensor read, no digest) and still tells
    a plainloop checkpoint from other files, with load_checkpoint's own messages."""
    from trainer.checkpoint import INTEGRITY_KEY, CheckpointError, atomic_save
    from trainer.cli.command import peek_checkpoint

    atomic_save(
        {"model": {"w": torch.zeros(4)}, "step": 3, "task": "era5"}, tmp_path / "run" / "checkpoints" / "last.pt"
    )
    meta = peek_checkpoint(tmp_path / "run", whole_below=0)
    assert meta["step"] == 3 and meta["task"] == "era5" and meta[INTEGRITY_KEY].startswith("unverified: read without")
    assert peek_checkpoint(tmp_path / "run")[INTEGRITY_KEY] == "verified"  # a small file: loaded whole
    torch.save({"a": torch.zeros(2)}, tmp_path / "d.pt")
    with pytest.raises(CheckpointError, match=r"no 'model' entry; keys: \['a'\]\)"):
        peek_checkpoint(tmp_path / "d.pt", whole_below=0)
    (tmp_path / "junk.pt").write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        peek_checkpoint(tmp_path / "junk.pt", whole_below=0)


def test_console_names_the_data_and_config_json_has_resolved_values(tmp_path, era5_cache, capsys):
    assert cli.main(["--max_steps", "2", "--output_dir", str(tmp_path), "--run_name", "d", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "data: the built-in SYNTHETIC sample" in out
    assert "-> 1 torch intra-op thread(s)" in out or torch.get_num_threads() == 1  # the small CPU preset: 1 thread
    eff = json.loads((tmp_path / "d" / "config.json").read_text())["effective"]
    assert eff["num_workers"] == 0 and eff["warmup_steps"] == 0 and eff["precision"] == "32"


def test_printed_commands_are_safe_to_paste(tmp_path):
    """A run directory with a space, or named `$(touch …)`, pasted from the printed line, is that directory."""
    import shlex

    marker = tmp_path / "pwned"
    for name in ("with space", f"$(touch {marker})", "it's"):
        cfg = tmp_path / name / "config.toml"
        line = cli.rerun_command(cfg, {})
        assert shlex.split(line)[-1] == str(cfg)
        subprocess.run(["bash", "-c", f"echo {line.split(' --config ', 1)[1]}"], check=True, capture_output=True)
    assert not marker.exists()


def _stopped_run(tmp_path: Path) -> Path:
    """A run with a mid-run checkpoint: 4 of 8 steps (max_steps 4 then extended is the same schedule length)."""
    argv = ["--max_steps", "8", "--checkpoint_every", "2", "--batch_size", "16", "--output_dir", str(tmp_path)]
    assert cli.main([*argv, "--run_name", "r", *SMALL]) == 0
    return tmp_path / "r"


def test_resume_refuses_a_changed_batch_size_or_a_budget_below_its_step(tmp_path, era5_cache, capsys):
    """`--resume RUN --batch_size 32` printed "batch 15 of 8", rewrote last.pt and ended in a StopIteration;
    `--split_ratio`/`--offset` moved trained months into the test split; `--max_steps 10` on a run at step 32
    declared it finished and scored the test split. Each is refused with one line before any file changes."""
    run = _stopped_run(tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    for flags, message in (
        (["--batch_size", "32"], "--batch_size 32: the run at"),
        (["--accumulate_grad_batches", "2"], "--accumulate_grad_batches 2: the run at"),
        (["--seed", "7"], "--seed 7: the run at"),
        (["--split_ratio", "0.5", "0.25", "0.25"], "--split_ratio 0.5 0.25 0.25: the run at"),
        (["--offset", "2"], "--offset 2: the run at"),
        (["--lr", "0.5"], "--lr 0.5: the run at"),
        (["--max_steps", "3"], "--max_steps 3: the run at"),
    ):
        capsys.readouterr()
        assert exit_code(["--resume", str(run), *flags]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 2, err
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before


def test_printed_commands_name_the_script_as_it_was_started(tmp_path, monkeypatch):
    """Started as `python ../plainloop/train_optimized.py` from another directory, the resume and re-run lines name
    that path, so they run from where the user is; in-process (argv[0] is not the script) the plain name."""
    from trainer.cli.command import cli_script, cli_session
    from trainer.usercode import resume_hint

    monkeypatch.setattr(sys, "argv", ["../my dir/train_optimized.py", "--epochs", "1"])
    assert cli_script() == "'../my dir/train_optimized.py'"
    with cli_session():
        assert resume_hint("runs/a b") == "python '../my dir/train_optimized.py' --resume 'runs/a b'"
    assert (
        cli.rerun_command(Path("r/config.toml"), {}) == "python '../my dir/train_optimized.py' --config r/config.toml"
    )
    monkeypatch.setattr(sys, "argv", ["pytest"])
    assert cli.rerun_command(Path("r/config.toml"), {}) == "python train_optimized.py --config r/config.toml"


def test_printed_commands_under_the_installed_command_say_plainloop(monkeypatch):
    """Started as the `plainloop` console command, the resume and re-run lines are `plainloop ...`."""
    from trainer.cli.command import cli_command, cli_session
    from trainer.usercode import resume_hint

    monkeypatch.setattr(sys, "argv", ["/venv/bin/plainloop", "--epochs", "1"])
    assert cli_command() == "plainloop" and cli_command("torchrun --nproc_per_node 2").startswith("torchrun")
    with cli_session():
        assert resume_hint("runs/a") == "plainloop --resume runs/a"
    assert cli.rerun_command(Path("r/config.toml"), {}) == "plainloop --config r/config.toml"
