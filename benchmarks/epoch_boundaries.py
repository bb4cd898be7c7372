"""What an epoch boundary costs: the same optimizer steps as many short epochs and as one long one.

    .venv/bin/python -m benchmarks.epoch_boundaries --reps 5 --threads 1     # ~2 min on 2 CPU cores

Rows (the MLP, batch and AdamW of benchmarks/loop_overhead.py, data in memory):
  short / long   --short EPOCHSxSTEPS (150x4) against 1 x the same steps (600), for plainloop's Trainer and for
                 the hand-written loop (a new permutation and one loss.item() per epoch); timed from step
                 --warmup to the last step. short/long per loop, of the medians and paired; target for
                 plainloop: at most 1.15x.
  seed job       the seed guides' job shape: 500 epochs x 2 steps (200 samples, batch 100), the whole fit's
                 wall time (set-up included), plainloop's Trainer and the hand loop.
Repetitions are interleaved. The seed guides' model is too slow on a CPU for 500 epochs; the MLP keeps the
epoch boundaries, not the arithmetic, in the figure.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks import common as bc
from benchmarks.loop_overhead import TensorPairs, make_data, make_model, make_optimizer, mse_loss

TARGET_SHORT_VS_LONG = 1.15


def hand(x: torch.Tensor, y: torch.Tensor, epochs: int, a: argparse.Namespace) -> dict[str, float]:
    """A hand-written epoch loop; seconds (wall and CPU) from step `warmup` to the last step, and the whole run's."""
    t_start, c0 = time.perf_counter(), time.process_time()
    model = make_model(a.dim, a.hidden, a.seed)
    opt, bs, g = make_optimizer(model, a.lr), a.batch_size, torch.Generator().manual_seed(a.seed)
    steps_per_epoch, step, t0 = x.shape[0] // bs, 0, t_start
    for _ in range(epochs):
        order = torch.randperm(x.shape[0], generator=g)
        for i in range(steps_per_epoch):
            if step == a.warmup:
                t0, c0 = time.perf_counter(), time.process_time()
            idx = order[i * bs : (i + 1) * bs]
            loss = F.mse_loss(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        loss.item()  # the epoch's loss, printed by most hand loops
    t = time.perf_counter()
    return {"timed_s": t - t0, "cpu_s": time.process_time() - c0, "wall_s": t - t_start, "steps": step}


def plainloop(x: torch.Tensor, y: torch.Tensor, epochs: int, a: argparse.Namespace) -> dict[str, float]:
    """plainloop's Trainer with its defaults; the timed window from its metrics rows (one at every epoch end), and
    the CPU seconds between the same steps' ends."""
    from trainer import Callback, Task, TrainConfig, Trainer

    cpu: dict[int, float] = {}

    class CPUClock(Callback):
        def on_train_batch_end(self, trainer: Any, outputs: torch.Tensor, batch: Any, batch_idx: int) -> None:
            cpu[trainer.progress.step] = time.process_time()

    t_start = time.perf_counter()
    task = Task("epochs", make_model(a.dim, a.hidden, a.seed), TensorPairs(x, y), loss_fn=mse_loss)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(epochs=epochs, batch_size=a.batch_size, lr=a.lr, seed=a.seed, output_dir=tmp,
                          run_name="epochs", device="cpu", log_every=math.gcd(TrainConfig.log_every, a.warmup))  # fmt: skip
        with bc.quiet():
            summary = Trainer(cfg, task, log=lambda _s: None, callbacks=[CPUClock()]).fit()
        wall = time.perf_counter() - t_start
        times = bc.step_times(summary["run_dir"])
    last = max(times)
    first = a.warmup if a.warmup in times else min(times)
    return {"timed_s": times[last] - times[first], "cpu_s": cpu[last] - cpu[first], "wall_s": wall, "steps": last}


LOOPS = {"hand": hand, "plainloop": plainloop}
FLAGS = [("--short", "150x4", "EPOCHSxSTEPS of the short-epoch run"),
         ("--seed-job", "500x2", "EPOCHSxSTEPS of the seed job row"), ("--seed-batch", 100, "batch of the seed job row"),
         ("--warmup", 100, "untimed leading steps"), ("--batch-size", 64, "batch size of short/long"),
         ("--dim", 32, "input features"), ("--hidden", 64, "hidden units"), ("--lr", 1e-3, "AdamW learning rate"),
         ("--seed", 0, "seed"), ("--out", str(bc.RESULTS_DIR / "epoch_boundaries_cpu.json"), "JSON path")]  # fmt: skip


def parse_shape(text: str, flag: str) -> tuple[int, int]:
    try:
        e, s = (int(v) for v in text.lower().split("x"))
        if e < 1 or s < 1:
            raise ValueError
    except ValueError:
        raise SystemExit(f"{flag} {text!r}: give EPOCHSxSTEPS, both whole numbers >= 1, e.g. 150x4") from None
    return e, s


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = bc.parser(__doc__, FLAGS, timing=(5, 1))
    a = ap.parse_args(argv)
    epochs, per_epoch = parse_shape(a.short, "--short")
    job_epochs, job_steps = parse_shape(a.seed_job, "--seed-job")
    steps = epochs * per_epoch
    if not 1 <= a.warmup < steps or a.warmup % per_epoch:
        ap.error(f"--warmup {a.warmup}: must be below {steps} steps and a multiple of {per_epoch} (an epoch end)")
    env = bc.environment(torch.device("cpu"))
    runs = {  # name: (loop, epochs, x, y)
        "short": (epochs, *make_data(per_epoch * a.batch_size, a.dim, a.seed)),
        "long": (1, *make_data(steps * a.batch_size, a.dim, a.seed)),
    }
    job_a = argparse.Namespace(**{**vars(a), "batch_size": a.seed_batch, "warmup": job_steps})
    job_x, job_y = make_data(job_steps * a.seed_batch, a.dim, a.seed)
    reps: dict[str, list[dict[str, Any]]] = {f"{lp}_{r}": [] for lp in LOOPS for r in (*runs, "seed_job")}
    for rep in range(a.reps):
        waited = a.wait(rep)
        for lp, fn in LOOPS.items():
            for r, (ep, x, y) in runs.items():
                reps[f"{lp}_{r}"].append({**fn(x, y, ep, a), "rep": rep, "loadavg": waited})
            reps[f"{lp}_seed_job"].append({**fn(job_x, job_y, job_epochs, job_a), "rep": rep, "loadavg": waited})
        print(
            f"[epochs] rep {rep + 1}/{a.reps}: " + ", ".join(f"{k} {v[-1]['timed_s']:.3f} s" for k, v in reps.items())
        )
    per_step = {k: [r["timed_s"] / (r["steps"] - (a.warmup if "seed" not in k else job_steps)) for r in v]
                for k, v in reps.items()}  # fmt: skip
    cpu_step = {k: [r["cpu_s"] / (r["steps"] - (a.warmup if "seed" not in k else job_steps)) for r in v]
                for k, v in reps.items()}  # fmt: skip
    ratio = {lp: {"ratio": bc.stats(per_step[f"{lp}_short"])["median"] / bc.stats(per_step[f"{lp}_long"])["median"],
                  "paired": bc.paired(per_step[f"{lp}_short"], per_step[f"{lp}_long"]),
                  # CPU time: what a loaded machine's descheduling does not inflate (I/O waits are not in it)
                  "cpu_ratio": bc.stats(cpu_step[f"{lp}_short"])["median"] / bc.stats(cpu_step[f"{lp}_long"])["median"],
                  "cpu_paired": bc.paired(cpu_step[f"{lp}_short"], cpu_step[f"{lp}_long"])} for lp in LOOPS}  # fmt: skip
    target = bc.target_check("plainloop short/long", ratio["plainloop"]["ratio"], ratio["plainloop"]["paired"],
                          TARGET_SHORT_VS_LONG, higher=False)  # fmt: skip
    job = {lp: bc.stats([r["wall_s"] for r in reps[f"{lp}_seed_job"]]) for lp in LOOPS}
    result: dict[str, Any] = {
        "schema": "plainloop-bench-epoch-boundaries-1",
        "command": "python -m benchmarks.epoch_boundaries " + " ".join(argv if argv is not None else a.argv),
        "environment": env,
        "config": ap.config(a),
        "torch_threads": torch.get_num_threads(),
        "repetitions": reps,
        "us_per_step": {k: bc.stats([1e6 * v for v in vs]) for k, vs in per_step.items()},
        "cpu_us_per_step": {k: bc.stats([1e6 * v for v in vs]) for k, vs in cpu_step.items()},
        "short_vs_long": ratio,
        "seed_job_wall_s": job,
        "targets": [target],
    }
    us = result["us_per_step"]
    loads = [r["loadavg"][0] for r in reps["hand_short"] if r["loadavg"]] or [math.nan]
    rows = [[lp, f"{us[f'{lp}_short']['median']:.0f}", f"{us[f'{lp}_long']['median']:.0f}",
             f"{ratio[lp]['ratio']:.2f}× ({ratio[lp]['paired']:.2f}×)",
             f"{ratio[lp]['cpu_ratio']:.2f}× ({ratio[lp]['cpu_paired']:.2f}×)",
             f"{job[lp]['median']:.2f} ({job[lp]['min']:.2f}–{job[lp]['max']:.2f})"] for lp in LOOPS]  # fmt: skip
    head = ["loop", f"µs/step, {epochs} epochs × {per_epoch}", f"µs/step, 1 epoch × {steps}",
            "short / long (paired)", "the same in CPU time (paired)", f"seed job s, {job_epochs} × {job_steps} steps of {a.seed_batch}"]  # fmt: skip
    md = (
        f"Epoch boundaries on {env['device_name']}, torch {env['torch']}, commit `{env['commit'][:12]}`, "
        f"{a.reps} interleaved repetitions, {torch.get_num_threads()} torch thread(s), 1-minute load average "
        f"{min(loads):.1f}–{max(loads):.1f} at their starts; steps {a.warmup}..{steps} timed; seed job: whole fit, "
        f"set-up included.\n\n{bc.md_table(head, rows)}\n\n"
        f"Target: plainloop short/long ≤ {TARGET_SHORT_VS_LONG}×: **{'met' if target['met'] else 'missed'}** "
        "(of the medians and paired; both must reach it).\n"
    )
    out = bc.write_result(a.out, result, md)
    print(f"[epochs] wrote {out} and {out.with_suffix('.md')}")
    return result


if __name__ == "__main__":
    main()
