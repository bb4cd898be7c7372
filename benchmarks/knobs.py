"""What channels_last and deterministic mode cost or gain: training steps of the SST and re-ID models, side by side.

    .venv/bin/python -m benchmarks.knobs                      # ~2 min on 2 shared CPU cores
    .venv/bin/python -m benchmarks.knobs --steps 40 --repeats 5

Each configuration trains a fresh copy of the same model on the same batches (forward, backward, AdamW step) with
one knob changed: `default`, `channels_last` (trainer/knobs.py: 4-D weights and batches in NHWC) and
`deterministic` (torch.use_deterministic_algorithms(True)). Repetitions are interleaved (the machine is shared);
the table reports the median samples/s and its ratio to `default`. Models: the RecursiveAttentionTransformer at the
CPU demo's size and grid (5 deg, d_model 64; it has no convolutions: its 4-D input is reshaped into patches) and the
re-ID ReIDNet (convolutions + BatchNorm) on the synthetic set's 32 x 16 images. On a CPU this measures oneDNN's
kernels only: cuDNN's NHWC tensor-core kernels and CUDA's deterministic kernels are not measured here.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import RESULTS_DIR, environment, loadavg, md_table, stats, wait_for_quiet, write_result
from trainer.knobs import channels_last, to_channels_last

CONFIGS = ("default", "channels_last", "deterministic")


def sst_case(batch: int) -> tuple[nn.Module, Callable[[nn.Module, Any], torch.Tensor], list[Any]]:
    from models.ratransformer import RecursiveAttentionTransformer
    from tasks.era5 import CPU_PRESET

    torch.manual_seed(0)
    h, w, c = 33, 72, int(CPU_PRESET["seq_len"]) - 1  # 5 deg over 80S-80N, all longitudes
    kw: dict[str, Any] = {
        k: CPU_PRESET[k] for k in ("d_model", "num_heads", "num_layers", "dim_feedforward", "recursion_depth")
    }
    model = RecursiveAttentionTransformer(width=w, height=h, seq_len=int(CPU_PRESET["seq_len"]), dropout=0.0, **kw)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(batch, c, h, w, generator=g), torch.randn(batch, h, w, generator=g)) for _ in range(4)]

    def loss(m: nn.Module, b: Any) -> torch.Tensor:
        return F.mse_loss(m(b[0]), b[1])

    return model, loss, batches


def reid_case(batch: int) -> tuple[nn.Module, Callable[[nn.Module, Any], torch.Tensor], list[Any]]:
    from models.reid_net import ReIDLoss, ReIDNet

    torch.manual_seed(0)
    model = ReIDNet(num_classes=256, width=32)
    crit = ReIDLoss()
    g = torch.Generator().manual_seed(1)
    labels = torch.arange(batch) // 4
    batches = [(torch.randn(batch, 3, 32, 16, generator=g), labels) for _ in range(4)]

    def loss(m: nn.Module, b: Any) -> torch.Tensor:
        return crit(m(b[0]), b[1])

    return model, loss, batches


def run_config(name: str, case: tuple, steps: int, warmup: int) -> float:
    """Samples/s of `steps` training steps after `warmup` untimed ones, with knob `name`."""
    base, loss_fn, batches = case
    model = copy.deepcopy(base)
    move = lambda b: b  # noqa: E731
    if name == "channels_last":
        channels_last(model, torch.device("cpu"))
        move = to_channels_last
    torch.use_deterministic_algorithms(name == "deterministic")
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model.train()
        n = batches[0][0].shape[0]
        t0 = 0.0
        for i in range(warmup + steps):
            if i == warmup:
                t0 = time.perf_counter()
            b = move(batches[i % len(batches)])
            loss = loss_fn(model, b)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return steps * n / (time.perf_counter() - t0)
    finally:
        torch.use_deterministic_algorithms(False)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps per repetition (default: 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (default: 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1, the CPU demo's setting)")
    p.add_argument("--max_load", type=float, default=2.5, help="wait for a 1-min load below this (default: 2.5)")
    p.add_argument("--max_wait", type=float, default=300, help="seconds to wait for it at most (default: 300)")
    p.add_argument("--out", default=str(RESULTS_DIR / "knobs_cpu.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    quiet = wait_for_quiet(args.max_load, args.max_wait)
    cases = {"sst (RecursiveAttentionTransformer, batch 16)": sst_case(16), "reid (ReIDNet, batch 32)": reid_case(32)}
    raw: dict[str, dict[str, list[float]]] = {c: {k: [] for k in CONFIGS} for c in cases}
    for r in range(args.repeats):
        for cname, case in cases.items():
            for k in CONFIGS:
                sps = run_config(k, case, args.steps, args.warmup)
                raw[cname][k].append(sps)
                print(f"[knobs] rep {r + 1} {cname} {k}: {sps:.1f} samples/s", flush=True)
    load_after = loadavg()
    rows, summary = [], {}
    for cname in cases:
        st = {k: stats(raw[cname][k]) for k in CONFIGS}
        # each repetition's ratio to the default run just before it: slow drifts of the machine's load cancel
        paired = {k: stats([a / b for a, b in zip(raw[cname][k], raw[cname]["default"])]) for k in CONFIGS}
        summary[cname] = {
            k: {
                "median_samples_per_s": st[k]["median"],
                "spread": st[k]["spread"],
                "paired_ratio_median": paired[k]["median"],
                "paired_ratio_range": [paired[k]["min"], paired[k]["max"]],
            }
            for k in CONFIGS
        }
        for k in CONFIGS:
            rows.append(
                [cname, k, f"{st[k]['median']:.1f}", f"{st[k]['spread']:.0%}",
                 f"{paired[k]['median']:.2f}x ({paired[k]['min']:.2f}-{paired[k]['max']:.2f})"]
            )  # fmt: skip
    table = md_table(
        ["model", "knob", "samples/s (median)", "spread (max-min)/median", "vs default, paired (range)"], rows
    )
    cmd = "python -m benchmarks.knobs " + " ".join(sys.argv[1:] if argv is None else argv)
    md = (
        f"# channels_last and deterministic on a CPU\n\nCommand: `{cmd.strip()}`; {args.repeats} interleaved "
        f"repetitions of {args.steps} steps, {args.threads} torch thread(s), "
        f"torch {torch.__version__}; load average {quiet['loadavg']} at the start, {load_after} at the end "
        f"({environment(torch.device('cpu'))['cpu_count']} cores).\n\n{table}\n\nPaired: the median over repetitions of each run's "
        f"samples/s over the default run's in the same repetition; a range that straddles 1.00 is no measured "
        f"difference. CPU kernels only: cuDNN's NHWC tensor-core convolutions and "
        f"CUDA's deterministic kernels are not measured here.\n"
    )
    result = {
        "environment": environment(torch.device("cpu")),
        "command": cmd.strip(),
        "config": vars(args),
        "load": {"start": quiet, "end": load_after},
        "repetitions": raw,
        "summary": summary,
    }
    path = write_result(args.out, result, md)
    print(f"[knobs] written {path}")


if __name__ == "__main__":
    main()
