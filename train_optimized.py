#!/usr/bin/env python
"""plainloop command line: train a built-in task with every speed-up on by default.

    python train_optimized.py                                   # ERA5 SST demo on the built-in sample data
    python train_optimized.py --batch_size 8 --num_workers 16 --compile_model --validation_interval 20
    python train_optimized.py --config configs/era5.toml --epochs 5          # a config file; flags win
    python train_optimized.py --resume runs/era5-20261122-004404            # continue, with the run's settings
    python train_optimized.py --task reid                       # cross-modality re-ID on the synthetic set
    python train_optimized.py --baseline                        # the seed guides' unoptimised "before" loop
    python train_optimized.py --system_report                   # measured bottleneck report, then exit
    torchrun --nproc_per_node 2 train_optimized.py ...          # DDP (or NPROC_PER_NODE=2 ./optimize_training.sh)

Every flag comes from one place: TrainConfig's fields (trainer/config.py), the task builders' parameters
(tasks/era5.py, tasks/reid.py) and RunOptions below. Exit codes: 0 done, 2 a bad input (one clear line; --debug
for the traceback), 3 training diverged, 128 + N stopped by signal N after writing last.pt.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch

from tasks import ERA5_MODEL_KEYS, TASK_BUILDERS, resolve_task_args, task_module, train_defaults
from trainer.checkpoint import CheckpointError
from trainer.checkpointer import ResumeError
from trainer.config import TrainConfig, knob
from trainer.options import (
    ConfigError,
    add_dataclass_arguments,
    add_function_arguments,
    check_keys,
    coerce,
    function_parameters,  # fmt: skip
    load_config_file,
)
from trainer.runfiles import RunDirError, find_resumable
from trainer.setup import launch_prefix

RUN = "task and run"
TOOLS = "measurement tools"


@dataclass
class RunOptions:
    """Settings of the command line itself: which task, which files, which tools around the loop."""

    task: str = knob("era5", "what to train", RUN, choices=tuple(TASK_BUILDERS))
    config: str | None = knob(
        None,
        "a .toml/.json/.yaml file of settings, keys = flag names (seed 002's mmseg names too); flags given here win",
        RUN,
    )
    preset: str = knob(
        "auto",
        "ERA5 model/grid preset: seed = seed 000's config (2 deg, d_model 512); cpu = "
        "reduced; auto = seed on a GPU, cpu otherwise. Explicit flags override it",
        RUN,
        choices=("auto", "cpu", "seed"),
    )
    debug: bool = knob(False, "show the traceback of known errors too (also PLAINLOOP_DEBUG=1)", RUN)
    logger: str = knob(
        "jsonl",
        "jsonl = metrics.jsonl only; tensorboard = also TensorBoard events in RUN_DIR (tensorboard --logdir OUTPUT_DIR)",
        RUN,
        choices=("jsonl", "tensorboard"),
    )
    plots: bool = knob(True, "write plots after training (needs matplotlib)", RUN)
    monitor_interval: float = knob(1.0, "seconds between TrainingMonitor samples of CPU/GPU use", TOOLS, gt=0)
    profile: bool = knob(False, "write a torch.profiler trace of a few steps into RUN_DIR/profile, then stop", TOOLS)
    profile_then_train: bool = knob(False, "with --profile: go on and train after profiling", TOOLS)
    system_report: bool = knob(
        False,
        "profile this configuration, diagnose the bottleneck, measure recommended "
        "settings, write report.md to the run directory, and exit",
        TOOLS,
    )
    report_steps: int = knob(30, "steps per trial of --system_report", TOOLS, min=1)
    report_repeats: int = knob(
        3, "interleaved repetitions of each --system_report trial (medians reported)", TOOLS, min=1
    )
    price_per_kwh: float | None = knob(
        None, "--system_report: electricity price, to project the job's cost", TOOLS, gt=0
    )
    price_per_gpu_hour: float | None = knob(
        None, "--system_report: price of one GPU hour (cloud), for the projection", TOOLS, gt=0
    )
    currency: str = knob("", "--system_report: currency label of the prices, e.g. EUR", TOOLS)
    power_w: float | None = knob(
        None,
        "--system_report: the machine's power draw in watts when NVML/RAPL cannot measure it",
        TOOLS,
        gt=0,
    )
    auto_batch_size: bool = knob(False, "largest batch that fits; keeps the effective batch with accumulation", TOOLS)
    auto_num_workers: bool = knob(False, "measure loader throughput and pick num_workers", TOOLS)


KNOWN_ERRORS = (ConfigError, ResumeError, RunDirError, CheckpointError, FileNotFoundError, ValueError)
NOT_IN_CONFIG_FILE = ("config", "debug", "resume")  # never written into a run's config.toml


class _Parser(argparse.ArgumentParser):
    """A bad flag is one line (argparse would print its whole usage block, 80 lines, before it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists every flag)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="train_optimized.py",
        description="plainloop: fast training in plain PyTorch.",
        epilog="Exit codes: 0 done, 2 bad input, 3 diverged, 128+N stopped by signal N.",
    )
    seen: set[str] = set()
    add_dataclass_arguments(p, RunOptions, seen)
    for name, builder in TASK_BUILDERS.items():
        mod = task_module(name)
        add_function_arguments(
            p,
            builder(),
            getattr(mod, "ARGS_HELP", {}),
            f"{name} task",
            skip=("seed", "device_cache", "learning_rate"),
            seen=seen,
            default_text={k: "from --preset" for k in ERA5_MODEL_KEYS} if name == "era5" else {},
        )
    add_dataclass_arguments(p, TrainConfig, seen)
    return p


def names() -> dict[str, dict[str, Any]]:
    """{"run" | "train" | task: {flag name: type}} — where each setting belongs."""
    import typing

    out = {"run": typing.get_type_hints(RunOptions), "train": typing.get_type_hints(TrainConfig)}
    for name, builder in TASK_BUILDERS.items():
        out[name] = {k: tp for k, (tp, _) in function_parameters(builder()).items()}
    return out


# ------------------------------------------------------------------------------------------- settings
def resolve_settings(explicit: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """defaults <- the resumed run's config.toml <- --config file <- flags typed on the command line."""
    kinds = names()
    all_types = {k: tp for group in kinds.values() for k, tp in group.items()}
    file_vals: dict[str, Any] = {}
    if explicit.get("config"):
        file_vals = load_config_file(explicit["config"], notes)
        file_vals = {k: v for k, v in file_vals.items() if k not in NOT_IN_CONFIG_FILE}
        check_keys(file_vals, all_types, f"--config {explicit['config']}")
        file_vals = coerce(file_vals, all_types, f"--config {explicit['config']}")
    given = {**file_vals, **explicit}
    resume = given.get("resume")
    saved: dict[str, Any] = {}
    if resume:
        run_dir = _resume_dir(resume, given)
        # a checkpoint file is resumed from itself; its run directory only supplies the saved settings
        file_given = resume != "auto" and Path(resume).is_file()
        given["resume"] = resume if file_given else (str(run_dir) if run_dir else None)
        if run_dir is None:
            notes.append(f"resume auto: nothing to resume under {_auto_place(given)}; starting a new run")
        if run_dir is not None and (run_dir / "config.toml").is_file():
            saved = load_config_file(run_dir / "config.toml")
            saved = coerce({k: v for k, v in saved.items() if k in all_types}, all_types, str(run_dir / "config.toml"))
            saved.pop("run_name", None)
            saved.pop("output_dir", None)
            for k, v in given.items():
                if k in saved and saved[k] != v and k not in NOT_IN_CONFIG_FILE:
                    notes.append(f"resume: {k} {saved[k]!r} -> {v!r} (given now)")
    out = {**saved, **given}
    # one length (or validation interval) in two units: the one given with the higher priority wins, so
    # `--config seed002_mmseg.toml --max_steps 4` shortens the file's runner.max_iters (max_batches) run
    layers = [("the command line", explicit), (f"--config {explicit.get('config')}", file_vals), ("the run", saved)]
    for what, pair in (
        ("run's length", ("max_steps", "max_batches")),
        ("validation interval", ("val_check_steps", "val_check_batches")),
    ):
        if all(out.get(k) is not None for k in pair):
            rank = {k: next(i for i, (_, d) in enumerate(layers) if d.get(k) is not None) for k in pair}
            if rank[pair[0]] != rank[pair[1]]:
                win, lose = sorted(pair, key=rank.__getitem__)
                notes.append(
                    f"{win}={out[win]} from {layers[rank[win]][0]} replaces {lose}={out[lose]} from "
                    f"{layers[rank[lose]][0]} (both set the {what}, in optimizer steps or in batches)"
                )
                out.pop(lose)
    return out


def _resume_dir(resume: str, given: dict[str, Any]) -> Path | None:
    out = Path(given.get("output_dir", TrainConfig.output_dir))
    if resume != "auto":
        p = Path(resume)
        if not p.exists():
            raise ResumeError(f"--resume {resume}: no such checkpoint or run directory")
        return p if p.is_dir() else p.parent.parent
    if given.get("run_name"):  # a fixed name: continue it if it has a checkpoint, else start it
        cand = out / given["run_name"]
        return cand if (cand / "checkpoints" / "last.pt").is_file() else None
    return find_resumable(out, given.get("task", RunOptions.task))


def _auto_place(given: dict[str, Any]) -> str:
    out = Path(given.get("output_dir", TrainConfig.output_dir))
    if given.get("run_name"):
        return str(out / given["run_name"])
    return f"{out} (no unfinished {given.get('task', RunOptions.task)}-* run with a checkpoint)"


def split_settings(values: dict[str, Any]) -> tuple[RunOptions, dict[str, Any], dict[str, Any]]:
    """(run options, task builder kwargs, TrainConfig kwargs) from one flat dict of settings."""
    kinds = names()
    run = RunOptions(**{k: v for k, v in values.items() if k in kinds["run"]})
    task_keys = kinds[run.task]
    other_tasks = {k for name, group in kinds.items() if name not in ("run", "train", run.task) for k in group}
    stray = [k for k in values if k in other_tasks and k not in task_keys and k not in kinds["train"]]
    if stray:
        raise ConfigError(
            f"--task {run.task} does not take {', '.join('--' + k for k in stray)} (other task's settings)"
        )
    task_kw = {k: v for k, v in values.items() if k in task_keys and k not in ("seed", "device_cache")}
    train_kw = {k: v for k, v in values.items() if k in kinds["train"]}
    return run, task_kw, train_kw


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    explicit = vars(parser.parse_args(argv))
    debug = explicit.get("debug") or os.environ.get("PLAINLOOP_DEBUG", "") not in ("", "0")
    try:
        return run(explicit)
    except KNOWN_ERRORS as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        print("(run with --debug or PLAINLOOP_DEBUG=1 for the traceback)", file=sys.stderr)
        return 2


def run(explicit: dict[str, Any]) -> int:
    notes: list[str] = []
    values = resolve_settings(explicit, notes)
    opts, task_kw, train_kw = split_settings(values)
    on_gpu = torch.cuda.is_available() and str(train_kw.get("device") or "cuda").startswith("cuda")
    task_kw, preset_note = resolve_task_args(opts.task, task_kw, opts.preset, on_gpu, train_kw.get("batch_size"))
    if preset_note:
        notes.append(preset_note)
    task_kw.update(seed=train_kw.get("seed", TrainConfig.seed), device_cache=train_kw.get("device_cache"))
    say = print if int(os.environ.get("RANK", "0")) == 0 else (lambda *a, **k: None)  # under torchrun: rank 0 speaks
    for n in notes:
        say(f"[plainloop] {n}")
    task = TASK_BUILDERS[opts.task]()(**task_kw)
    for line in data_lines(task):
        say(f"[plainloop] {line}")
    defaults = train_defaults(opts.task, on_gpu, task_kw, len(task.train_set))
    cfg = TrainConfig(**{"run_name": None, **defaults, **train_kw})
    if opts.auto_batch_size or opts.auto_num_workers:
        from tasks.cli_tools import autotune

        cfg = autotune(cfg, task, opts)
    if opts.system_report:
        from tasks.cli_tools import system_report

        return system_report(cfg, opts, task_kw)
    sections = {
        "run": {k: v for k, v in dataclasses.asdict(opts).items() if k not in NOT_IN_CONFIG_FILE},
        "task": {k: v for k, v in task_kw.items() if k not in ("seed", "device_cache")},
    }
    if opts.profile:
        from tasks.cli_tools import profile

        profile(cfg, task, sections)
        if not opts.profile_then_train:
            say("[plainloop] profiled only, nothing trained (add --profile_then_train to go on and train)")
            return 0
    from trainer.loop import Trainer

    callbacks, monitor = plugins(opts, cfg)
    try:
        trainer = Trainer(cfg, task, callbacks=callbacks, monitor=monitor, config_sections=sections)
        for line in (
            [task.info["sampler"]] if isinstance(task.info.get("sampler"), str) else task.info.get("sampler") or []
        ):
            say(f"[plainloop] sampler: {line}")  # the P x K sampler's cache summary, once (rank 0)
        summary = trainer.fit()
    except ResumeError as e:
        changed = [n for n in notes if n.startswith("resume:")]
        raise ResumeError(
            f"{e}{' (settings changed from the saved run: ' + '; '.join(c[8:] for c in changed) + ')' if changed else ''}"
        ) from None
    if trainer.rt.is_main:
        report_run(summary, trainer.run_dir, opts, task.console_metrics)
    return 0


def data_lines(task: Any) -> list[str]:
    """Say where the data came from: the built-in synthetic sample, or the files read."""
    data = task.info.get("data")
    if isinstance(data, dict) and "source_files" in data:
        files = data["source_files"]
        what = (
            "the built-in SYNTHETIC sample (ERA5 format, not real data)"
            if data.get("builtin_sample")
            else f"{len(files)} file(s): {files[0]}{' ...' if len(files) > 1 else ''}"
        )
        return [f"data: {what}; months {data.get('months', '?')}, grid {data.get('grid', '?')}"]
    if task.info.get("data_source"):
        return [f"data: {task.info['data_source']}"]
    return []


def steps_text(summary: dict[str, Any]) -> str:
    """The steps of the run, and after a resume how many this process trained (its time and speed cover those)."""
    steps, now = summary["steps"], summary.get("steps_this_process", summary["steps"])
    return f"{steps} steps" + (f" ({now} since the resume)" if now != steps else "")


def plugins(opts: RunOptions, cfg: TrainConfig) -> tuple[list[Any], Any]:
    """The monitor, the verdict and the loggers, handed to the engine from outside."""
    from utils.callbacks import VerdictCallback
    from utils.performance_monitor import TrainingMonitor

    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = cfg.device or (f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    monitor = TrainingMonitor(interval=opts.monitor_interval, batch_size=cfg.batch_size, device=torch.device(device))
    callbacks: list[Any] = [VerdictCallback()]
    if opts.logger == "tensorboard":
        try:
            from utils.tensorboard_logger import TensorBoardLogger
        except ImportError as e:
            raise ConfigError(f"--logger tensorboard: {e}") from None
        callbacks.append(TensorBoardLogger())
    return callbacks, monitor


def report_run(summary: dict[str, Any], run_dir: Path, opts: RunOptions, shown: tuple[str, ...] | None = None) -> None:
    """The closing lines; of the final metrics, those in `shown` (the task's console_metrics; None: all)."""
    v = summary.get("verdict") or {}
    verdict = v.get("headline") or v.get("verdict", "not judged")
    sps = summary["samples_per_s"]
    print(
        f"[plainloop] done: {steps_text(summary)} in {summary['train_time_s']:.1f} s, "
        f"{f'{sps:.0f}' if sps else '?'} samples/s, {summary.get('skipped_steps', 0)} skipped, verdict: {verdict}"
    )
    if "test_scores" in summary:
        from utils.metrics import format_scores

        print("[plainloop] test split, latitude-weighted over ocean cells:")
        print(format_scores(summary["test_scores"]))
    elif summary["final_metrics"]:
        final = summary["final_metrics"]
        for k, v in final.items():
            if shown is None or k in shown:  # e.g. not re-ID's "<...>_trials" (a count of gallery draws)
                print(f"  {k}: {v:.4f}")
        hidden = len(final) - sum(1 for k in final if k in shown) if shown is not None else 0
        if hidden:
            print(f"  (+{hidden} more in summary.json)")
    if opts.plots:
        try:
            from utils.plot import plot_run

            paths = plot_run(run_dir)
            print(f"[plainloop] plots: {', '.join(str(p) for p in paths)}")
        except ImportError as e:
            print(f"[plainloop] plots skipped: {e}")
    print(f"[plainloop] run directory: {run_dir} (re-run: {rerun_command(run_dir / 'config.toml')})")


def rerun_command(config: Path, env: Any = os.environ) -> str:
    """The command that runs this job again: under torchrun (WORLD_SIZE > 1) with its torchrun prefix."""
    launch = launch_prefix(env)
    return f"{launch} train_optimized.py --config {config}" + (" (on each node)" if "--nnodes" in launch else "")


if __name__ == "__main__":
    sys.exit(main())
