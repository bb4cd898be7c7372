#!/usr/bin/env python
"""plainloop command line: train a built-in task with every speed-up on by default.

    python train_optimized.py                                   # ERA5 SST demo on the built-in sample data
    python train_optimized.py --batch_size 8 --num_workers 16 --compile_model --validation_interval 20
    python train_optimized.py --task reid                       # cross-modality re-ID on the synthetic set
    python train_optimized.py --baseline                        # the seed guides' unoptimised "before" loop
    python train_optimized.py --system_report                   # measured bottleneck report, then exit
    torchrun --nproc_per_node 2 train_optimized.py ...          # DDP (or NPROC_PER_NODE=2 ./optimize_training.sh)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch

from trainer.config import COMPILE_MODES, PRECISIONS, TrainConfig
from tasks import build_task
from tasks.era5 import CPU_PRESET, SEED_PRESET


def positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s} is not a positive integer")
    return v


def non_negative_int(s: str) -> int:
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{s} must be >= 0")
    return v


def positive_float(s: str) -> float:
    v = float(s)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{s} must be > 0")
    return v


def loss_scale(s: str) -> str | float:
    if s == "dynamic":
        return s
    try:
        return positive_float(s)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"{s!r}: use 'dynamic' or a positive number such as 1024") from None


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()  # defaults come from one place
    p = argparse.ArgumentParser(description="plainloop: fast training in plain PyTorch.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    B = argparse.BooleanOptionalAction

    g = p.add_argument_group("task and run")
    g.add_argument("--task", choices=["era5", "reid"], default="era5", help="what to train")
    g.add_argument("--data_path", default=None,
                   help="ERA5: netCDF file, directory, glob or comma-separated list (default: $ERA5_DATA_PATH, else "
                        "the built-in sample); reid: dataset root (default: synthetic set)")
    g.add_argument("--output_dir", default=d.output_dir, help="runs are written to OUTPUT_DIR/RUN_NAME")
    g.add_argument("--run_name", default=None, help="default: <task>-<timestamp>")
    g.add_argument("--resume", default=None, help="checkpoint file or run directory to continue exactly")
    g.add_argument("--seed", type=int, default=d.seed, help="seed for weights, data order and dropout")
    g.add_argument("--baseline", action="store_true",
                   help="the seed guides' unoptimised loop: fp32, num_workers=0, no pinning, .item() every step, "
                        "validation every epoch")
    g.add_argument("--preset", choices=["auto", "cpu", "seed"], default="auto",
                   help="ERA5 model/grid preset: seed = seed 000's config (2 deg, d_model 512); cpu = reduced (5 deg, "
                        "d_model 128); auto = seed on a GPU, cpu otherwise. Explicit flags override it")

    g = p.add_argument_group("ERA5 SST task")
    g.add_argument("--variable", default="sst", help="netCDF variable to read")
    g.add_argument("--lon", type=float, nargs=2, metavar=("W", "E"), default=[-180.0, 180.0],
                   help="area longitudes; may cross the dateline, e.g. 170 -120")
    g.add_argument("--lat", type=float, nargs=2, metavar=("S", "N"), default=[-80.0, 80.0], help="area latitudes")
    g.add_argument("--resolution", type=positive_float, default=None, help="grid in degrees (default: from preset)")
    g.add_argument("--seq_len", type=positive_int, default=2, help="months per sample: seq_len-1 inputs + 1 target")
    g.add_argument("--offset", type=non_negative_int, default=0, help="months between last input and target, minus 1")
    g.add_argument("--split_ratio", type=float, nargs="+", default=[0.8, 0.1, 0.1],
                   help="train/val/test fractions in time order")
    g.add_argument("--d_model", type=positive_int, default=None, help="(default: from preset)")
    g.add_argument("--num_heads", type=positive_int, default=None, help="(default: from preset)")
    g.add_argument("--num_layers", type=positive_int, default=None, help="(default: from preset)")
    g.add_argument("--dim_feedforward", type=positive_int, default=None, help="(default: from preset)")
    g.add_argument("--dropout", type=float, default=None, help="(default: from preset)")
    g.add_argument("--recursion_depth", type=positive_int, default=None, help="(default: from preset)")
    g.add_argument("--patch_size", type=positive_int, default=None, help="grid cells per token side (default: model's)")

    g = p.add_argument_group("re-ID task")
    g.add_argument("--reid_format", choices=["synthetic", "market1501", "sysu"], default="synthetic",
                   help="dataset layout under --data_path")
    g.add_argument("--num_instances", type=positive_int, default=4, help="K images per identity in a P x K batch")
    g.add_argument("--image_size", type=positive_int, nargs=2, metavar=("H", "W"), default=None,
                   help="resize images to H W (default: the task's)")
    g.add_argument("--num_identities", type=positive_int, default=None, help="synthetic set size (default: the task's)")

    g = p.add_argument_group("schedule and optimizer")
    g.add_argument("--epochs", type=positive_int, default=None, help="(default: 60 for the CPU demo, else 10)")
    g.add_argument("--max_steps", type=positive_int, default=None, help="stop after N optimizer steps")
    g.add_argument("--batch_size", type=positive_int, default=None,
                   help="per process (default: 150, the seed's; 32 for the small CPU demo data)")
    g.add_argument("--accumulate_grad_batches", type=positive_int, default=d.accumulate_grad_batches,
                   help="micro-batches per optimizer step")
    g.add_argument("--lr", type=positive_float, default=d.lr, help="learning rate at --ref_batch_size")
    g.add_argument("--ref_batch_size", type=positive_int, default=d.ref_batch_size,
                   help="batch size --lr was tuned for; enables --lr_scaling")
    g.add_argument("--lr_scaling", choices=["sqrt", "linear", "none"], default=d.lr_scaling,
                   help="how lr follows the batch size (seed 000: sqrt)")
    g.add_argument("--weight_decay", type=float, default=d.weight_decay, help="AdamW weight decay")
    g.add_argument("--warmup_steps", type=non_negative_int, default=d.warmup_steps, help="(default: 5%% of steps)")
    g.add_argument("--gradient_clip_val", type=positive_float, default=d.gradient_clip_val, help="clip threshold")
    g.add_argument("--gradient_clip_algorithm", choices=["norm", "value"], default=d.gradient_clip_algorithm,
                   help="clip by total norm or by value")

    g = p.add_argument_group("precision and device")
    g.add_argument("--precision", choices=PRECISIONS, default=d.precision,
                   help="auto = bf16-mixed where supported, 16-mixed on older GPUs, 32 on CPU")
    g.add_argument("--loss_scale", type=loss_scale, default=d.loss_scale, help="fp16 loss scale: dynamic or a number")
    g.add_argument("--tf32", action=B, default=d.tf32, help="TF32 matmul/cudnn on CUDA")
    g.add_argument("--cudnn_benchmark", action=B, default=d.cudnn_benchmark, help="cudnn autotuner")
    g.add_argument("--compile_model", action="store_true", help="torch.compile the model")
    g.add_argument("--compile_mode", choices=COMPILE_MODES, default=d.compile_mode, help="torch.compile mode")
    g.add_argument("--device", default=None, help="e.g. cuda:0 or cpu (default: cuda if available)")

    g = p.add_argument_group("data loading")
    g.add_argument("--num_workers", type=non_negative_int, default=None, help="(default: from the CPU count)")
    g.add_argument("--pin_memory", action=B, default=d.pin_memory, help="page-locked host batches")
    g.add_argument("--persistent_workers", action=B, default=d.persistent_workers, help="keep workers across epochs")
    g.add_argument("--prefetch_factor", type=positive_int, default=d.prefetch_factor, help="batches per worker ahead")
    g.add_argument("--drop_last", action=B, default=d.drop_last, help="drop the last incomplete batch")
    g.add_argument("--multiprocessing_context", choices=["spawn", "fork", "forkserver"], default=None,
                   help="worker start method (default: platform's; spawn on Windows)")
    g.add_argument("--device_cache", choices=["auto", "on", "off"], default="auto",
                   help="hold the whole dataset on the device when it fits")

    g = p.add_argument_group("logging, validation and checkpoints")
    g.add_argument("--log_every", type=positive_int, default=d.log_every, help="LOG_EVERY: steps per loss read-back")
    g.add_argument("--norm_every", type=positive_int, default=d.norm_every, help="NORM_EVERY: steps per grad-norm read")
    g.add_argument("--progress_every", type=positive_int, default=d.progress_every, help="progress bar refresh (batches)")
    g.add_argument("--progress_bar", action=B, default=d.progress_bar, help="show the tqdm bar")
    g.add_argument("--validation_interval", type=positive_int, default=d.validation_interval, help="epochs per validation")
    g.add_argument("--val_check_steps", type=positive_int, default=None, help="validate every N steps instead")
    g.add_argument("--checkpoint_every", type=positive_int, default=None, help="also checkpoint every N steps")

    g = p.add_argument_group("measurement tools")
    g.add_argument("--system_report", action="store_true",
                   help="profile this configuration, diagnose the bottleneck, measure recommended settings, write "
                        "report.md to the run directory, and exit")
    g.add_argument("--report_steps", type=positive_int, default=30, help="steps per trial of --system_report")
    g.add_argument("--report_repeats", type=positive_int, default=3,
                   help="interleaved repetitions of each --system_report trial (medians are reported)")
    g.add_argument("--profile", action="store_true", help="torch.profiler trace of a few steps into the run directory")
    g.add_argument("--auto_batch_size", action="store_true",
                   help="largest batch that fits; keeps the effective batch with gradient accumulation")
    g.add_argument("--auto_num_workers", action="store_true", help="measure loader throughput and pick num_workers")
    g.add_argument("--plots", action=B, default=True, help="write plots after training (needs matplotlib)")
    return p


def task_kwargs(args: argparse.Namespace, on_gpu: bool) -> tuple[dict[str, Any], str]:
    """Task builder arguments from the flags; returns (kwargs, preset note)."""
    if args.task == "reid":
        kw: dict[str, Any] = {"data_path": args.data_path, "reid_format": args.reid_format,
                              "num_instances": args.num_instances, "seed": args.seed}
        if args.image_size:
            kw["image_size"] = tuple(args.image_size)
        if args.num_identities:
            kw["num_identities"] = args.num_identities
        return kw, ""
    preset_name = args.preset if args.preset != "auto" else ("seed" if on_gpu else "cpu")
    preset = SEED_PRESET if preset_name == "seed" else CPU_PRESET
    kw = {"data_path": args.data_path, "variable": args.variable, "lon": tuple(args.lon), "lat": tuple(args.lat),
          "seq_len": args.seq_len, "offset": args.offset, "split_ratio": tuple(args.split_ratio),
          "patch_size": args.patch_size, "seed": args.seed}
    for k, v in preset.items():
        given = getattr(args, k)
        kw[k] = given if given is not None else v
    kw["device_cache"] = {"auto": None, "on": True, "off": False}[args.device_cache]
    note = (f"preset: {preset_name} ({'seed 000 configuration' if preset_name == 'seed' else 'reduced for a CPU'}:"
            f" {kw['resolution']:g} deg, d_model {kw['d_model']}, {kw['num_layers']} layers x {kw['recursion_depth']}"
            f" recursions); explicit flags override it")
    return kw, note


def config_from_args(args: argparse.Namespace, small_data: bool) -> TrainConfig:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    vals = {k: v for k, v in vars(args).items() if k in fields}
    vals["device_cache"] = {"auto": None, "on": True, "off": False}[args.device_cache]
    if vals["batch_size"] is None:
        vals["batch_size"] = 32 if small_data else TrainConfig.batch_size
    if vals["epochs"] is None:
        vals["epochs"] = 60 if small_data else TrainConfig.epochs
    return TrainConfig(**vals)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if abs(sum(args.split_ratio) - 1) > 1e-6 and sum(args.split_ratio) > 1:
        parser.error(f"--split_ratio {args.split_ratio} sums to more than 1")
    if args.lon[0] == args.lon[1] or args.lat[0] >= args.lat[1]:
        parser.error(f"--lon {args.lon} / --lat {args.lat}: give W != E and S < N")
    on_gpu = torch.cuda.is_available() and (args.device is None or args.device.startswith("cuda"))
    kw, note = task_kwargs(args, on_gpu)
    # The built-in sample data is small: the seed's batch of 150 would leave one step per epoch.
    small_data = args.data_path is None and not on_gpu
    try:
        cfg = config_from_args(args, small_data)
    except ValueError as e:
        parser.error(str(e))
    if note:
        print(f"[plainloop] {note}")

    from trainer.loop import Trainer, clone_task_model

    task = build_task(args.task, **kw)
    if args.auto_batch_size or args.auto_num_workers:
        cfg = autotune(cfg, task, args)
    if args.system_report:
        return system_report(cfg, args, kw)
    trainer = Trainer(cfg, task)
    if args.profile:
        profile(cfg, clone_task_model(task))
    summary = trainer.fit()
    if trainer.rt.is_main:
        report_run(summary, trainer.run_dir, args)
    return 0


def report_run(summary: dict[str, Any], run_dir: Path, args: argparse.Namespace) -> None:
    print(f"[plainloop] done: {summary['steps']} steps in {summary['train_time_s']:.1f} s, "
          f"{summary['samples_per_s'] or 0:.0f} samples/s, verdict: {summary['verdict']['verdict']}")
    if "test_scores" in summary:
        from utils.metrics import format_scores

        print("[plainloop] test split, latitude-weighted over ocean cells:")
        print(format_scores(summary["test_scores"]))
    if args.task == "reid":
        for k, v in summary["final_metrics"].items():
            print(f"  {k}: {v:.4f}")
    if args.plots:
        try:
            from utils.plot import plot_run

            paths = plot_run(run_dir)
            print(f"[plainloop] plots: {', '.join(str(p) for p in paths)}")
        except ImportError as e:
            print(f"[plainloop] plots skipped: {e}")
    print(f"[plainloop] run directory: {run_dir}")


def profile(cfg: TrainConfig, task: Any) -> None:
    from trainer.loop import Trainer
    from utils.profiling import profile_steps

    t = Trainer(dataclasses.replace(cfg, run_name=None, resume=None), task)
    out = Path(cfg.output_dir) / (cfg.run_name or f"{task.name}-profile") / "profile"
    res = profile_steps(t.step_fn(), out, steps=5, warmup=2)
    print(f"[plainloop] profiler trace: {res['trace']}; top ops: {res['table']}")


def autotune(cfg: TrainConfig, task: Any, args: argparse.Namespace) -> TrainConfig:
    from trainer.data import to_device
    from trainer.loop import Trainer, clone_task_model
    from utils.autotune import find_max_batch_size, tune_num_workers

    if args.auto_batch_size:
        probe = Trainer(dataclasses.replace(cfg, max_steps=1, progress_bar=False, resume=None),
                        clone_task_model(task), log=lambda s: None)
        ds = task.train_set

        def try_batch(bs: int) -> None:
            idx = torch.randint(0, len(ds), (bs,))
            batch = (ds.gather(idx.to(probe.rt.device)) if getattr(ds, "_plainloop_on_device", False)
                     else torch.utils.data.default_collate([ds[i] for i in idx.tolist()]))
            probe.forward_backward(to_device(batch, probe.rt.device), 1)
            probe.optimizer.zero_grad(set_to_none=True)

        # Memory is the limit on a GPU; on a CPU nothing runs out before the machine does, so the search
        # stops at a size that still leaves 8 optimizer steps per epoch.
        cap = 4096 if probe.rt.device.type == "cuda" else max(1, len(ds) // 8)
        target = cfg.batch_size * cfg.accumulate_grad_batches
        keep_effective = cfg.accumulate_grad_batches > 1
        res = find_max_batch_size(try_batch, start=2, max_batch=cap, target=target if keep_effective else None)
        if keep_effective:  # back-off: keep the effective batch, split into as few micro-batches as fit
            accum = res["accumulate_grad_batches"]
            bs = res["balanced_batch_size"]
            cfg = dataclasses.replace(cfg, batch_size=bs, accumulate_grad_batches=accum)
            print(f"[plainloop] auto_batch_size: largest that fits {res['batch_size']}; using {bs} x {accum} "
                  f"accumulation to keep the effective batch {target}")
        else:  # a larger batch: the learning rate follows it by --lr_scaling
            bs = res["batch_size"]
            cfg = dataclasses.replace(cfg, batch_size=bs, ref_batch_size=cfg.ref_batch_size or cfg.batch_size)
            print(f"[plainloop] auto_batch_size: {bs}{' (search cap)' if res['hit_max'] else ''}; lr follows "
                  f"by {cfg.lr_scaling} scaling from batch {cfg.ref_batch_size}")
        del probe
    if args.auto_num_workers:
        from torch.utils.data import DataLoader

        ds = task.train_set
        res = tune_num_workers(lambda n: DataLoader(ds, batch_size=cfg.batch_size, shuffle=True, num_workers=n,
                                                    persistent_workers=False), batches=20)
        print(f"[plainloop] auto_num_workers: {res['num_workers']} (samples/s by workers: "
              f"{json.dumps({str(k): round(v) for k, v in res['samples_per_s'].items()})})")
        best = res["num_workers"]
        # workers only matter when the data is read through a DataLoader
        cfg = dataclasses.replace(cfg, num_workers=best, device_cache=False if best > 0 else cfg.device_cache)
    return cfg


def system_report(cfg: TrainConfig, args: argparse.Namespace, kw: dict[str, Any]) -> int:
    from trainer.loop import Trainer
    from utils.system_report import run_system_report

    run_name = cfg.run_name or f"{args.task}-report"
    out = Path(cfg.output_dir) / run_name
    trial_no = 0

    def run_trial(overrides: dict[str, Any], steps: int) -> dict[str, Any]:
        nonlocal trial_no
        trial_no += 1
        task = build_task(args.task, **kw)
        c = dataclasses.replace(cfg, **overrides, max_steps=steps, progress_bar=False, save_best=False,
                                val_check_steps=None, validation_interval=10**6, output_dir=str(out / "trials"),
                                run_name=f"trial{trial_no}")
        t = Trainer(c, task, log=lambda m: None)
        warm = t.step_fn()
        for _ in range(2):  # warm-up outside the timing: worker start-up, compilation, allocator
            warm()
        s = t.fit()
        mon = s["monitor"]
        return {"samples_per_s": s["samples_per_s"], "data_wait_frac": mon.get("data_wait_frac"),
                "step_time_ms": 1000 * ((mon.get("iter_time_s") or {}).get("p50") or 0.0),
                "peak_mem_mb": s["peak_memory_mb"], "monitor": mon, "device_type": t.rt.device.type,
                "step_stats": {"num_workers": 0 if t.on_device else t.loader_kw.get("num_workers", 0),
                               "torch_threads": torch.get_num_threads()}}

    base = {k: getattr(cfg, k) for k in ("batch_size", "num_workers", "precision", "pin_memory", "compile_model",
                                         "device_cache")}
    path = run_system_report(run_trial, base, candidates=_report_candidates(cfg), steps=args.report_steps,
                             out_path=out / "report.md", config={"task": args.task, **cfg.to_dict(), **kw},
                             repeats=args.report_repeats)
    print(Path(path).read_text(encoding="utf-8"))
    print(f"[plainloop] report written to {path}")
    return 0


def _report_candidates(cfg: TrainConfig) -> list[dict[str, Any]]:
    """Settings worth measuring against the user's, whatever the verdict turns out to be."""
    c: list[dict[str, Any]] = [{"batch_size": cfg.batch_size * 2}]
    if cfg.device_cache is not True:
        c.append({"device_cache": True, "num_workers": 0})
    if cfg.device_cache is not False:
        c.append({"device_cache": False, "num_workers": 2})
    if torch.cuda.is_available():
        c += [{"precision": "bf16-mixed"}, {"compile_model": True}]
    return c


if __name__ == "__main__":
    sys.exit(main())
