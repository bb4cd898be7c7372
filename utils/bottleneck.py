"""Turn a run's measurements into one bottleneck verdict, its evidence and the one change most likely to help.

Input is a `TrainingMonitor.get_summary()` dict (see utils/performance_monitor.py) and, optionally,
`step_stats` from a short profile (utils/profiling.py): kernels_per_step, syncs_per_step, ... ; and world_size
(under DDP the monitor measures one rank, so its samples/s is quoted per rank).
No dependency beyond the standard library.

Verdicts, checked in this order (the first one that the evidence supports wins):
- "validation bound" / "checkpoint bound": validation (with the test) or the checkpoints the loop waited for took a
  large share of the run's wall time (`step_stats["wall_time"]`: summary.json's split); the steps are not the issue.
- "data-loading bound": the step spends a large share of its time waiting for the next batch.
- "memory bound": the GPU's memory is (nearly) full or the allocator had to retry (capacity), or most
  device time goes to elementwise/normalisation/copy kernels (bandwidth).
- "contended": other processes took the CPU cores this run could have used, or shared its GPU; the
  timings then describe the machine's load, not the training code, so no code-level verdict is given.
- "undetermined": the data wait was not measured and the rest of the evidence cannot separate waiting
  for data from launch overhead or compute; the verdict says what it could not judge.
- "host/launch bound": the GPU idles between kernels: low utilisation while not waiting for data,
  many small kernels or host syncs per step.
- "compute bound": the device is busy doing arithmetic; the remaining gains are in doing less of it
  or doing it in lower precision.
Every result has a one-line "headline" ("contended: other processes used 1.1 of 2 CPU cores").
"""

from __future__ import annotations

from typing import Any

__all__ = ["diagnose", "contention", "VERDICTS", "THRESHOLDS"]

VERDICTS = (
    "validation bound",
    "checkpoint bound",
    "data-loading bound",
    "epoch-boundary bound",
    "host/launch bound",
    "compute bound",
    "memory bound",
    "contended",
    "undetermined",
)

# Tunable cut-offs, in one place so the report can quote them.
THRESHOLDS = {
    "data_wait_frac": 0.20,  # ≥20% of step time waiting for data: the loader is the first thing to fix
    "gpu_mem_frac": 0.90,  # peak allocated ≥90% of the card: no headroom, batch size capped
    "gpu_util_busy": 80.0,  # NVML utilisation ≥80%: a kernel is running most of the time
    "gpu_util_idle": 60.0,  # <60% while not data-bound: the host is not feeding kernels fast enough
    "kernels_per_step_many": 300,  # a step of hundreds of tiny kernels is launch-bound unless they are big
    "short_step_ms": 15.0,  # launch overhead (~5-10 µs/kernel + Python) matters when steps are this short
    "elementwise_frac": 0.5,  # half the device time in elementwise/norm/copy ops: bandwidth-bound
    "cpu_saturated_frac": 0.75,  # process uses ≥75% of the cores it may use
    # contention: the machine is nearly full, others hold at least half a core, and we got <75% of ours
    "contention_machine_busy_pct": 85.0,
    "contention_others_cores": 0.5,
    "contention_wait_threads": 0.25,  # on average ≥0.25 of this run's threads were ready but had no free core
    "steal_pct": 10.0,  # hypervisor steal: other virtual machines on the same host took the CPU
    "gpu_other_process_frac": 0.25,  # another process on our GPU in ≥25% of the samples
    # ≥25% of the training time between steps, at ≥10 epoch ends: short epochs, not the steps, set the pace
    "between_steps_frac": 0.25,
    "epoch_ends_min": 10,
    # ≥30% of the wall time in validation, or ≥20% waiting for checkpoints: the run's edges set its pace
    "validation_frac": 0.30,
    "checkpoint_frac": 0.20,
}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _wanted_cores(summary: dict[str, Any], st: dict[str, Any]) -> float:
    """Cores this run could have kept busy: torch threads + loader workers, at most the usable cores."""
    usable = summary.get("cpu_usable_cores") or summary.get("cpu_count_logical") or 1
    threads = st.get("torch_threads")
    if threads is None:
        return float(usable)
    return float(min(usable, threads + (st.get("num_workers") or 0)))


def contention(summary: dict[str, Any], step_stats: dict[str, Any] | None = None) -> tuple[str, list[str]] | None:
    """(headline detail, evidence) when other processes took this run's CPU or GPU; None otherwise.

    CPU: the machine was ≥85% busy, processes outside this run (and its loader workers) held ≥0.5 core,
    and this run was starved: on average ≥0.25 of its threads were ready to run but had no free core (Linux run
    queue), or, where that is not measured, it got under 75% of the cores it could use. Or the hypervisor
    stole ≥10% of the CPU time.
    GPU (NVML): another process had a context on this GPU in ≥25% of the samples."""
    T, st = THRESHOLDS, dict(step_stats or {})
    evidence: list[str] = []
    heads: list[str] = []
    busy, others = summary.get("cpu_percent_mean"), summary.get("cpu_others_cores_mean")
    proc, ncpu = summary.get("process_cpu_percent_mean"), summary.get("cpu_count_logical")
    steal = summary.get("cpu_steal_percent_mean")
    wanted = _wanted_cores(summary, st)
    wait, waiting = summary.get("cpu_wait_frac"), summary.get("cpu_wait_threads_mean")
    if busy is not None and others is not None and proc is not None:
        got = proc / 100.0
        # Starved: measured directly by the run-queue wait where Linux gives it, else by what we got.
        if waiting is not None:
            starved = waiting >= T["contention_wait_threads"]
        else:
            starved = got < T["cpu_saturated_frac"] * wanted
        if busy >= T["contention_machine_busy_pct"] and others >= T["contention_others_cores"] and starved:
            heads.append(f"other processes used {others:.1f} of {ncpu} CPU cores")
            evidence.append(
                f"the machine was {busy:.0f}% busy; other processes kept {others:.1f} of its {ncpu} cores busy "
                f"while this run got {got:.2f} of the {wanted:g} cores it could use"
            )
            if wait is not None and waiting is not None:
                evidence.append(
                    f"this run's threads spent {_pct(wait)} of the time they were ready to run waiting for a free "
                    f"core ({waiting:.2f} threads waiting on average)"
                )
            top = summary.get("other_processes_cpu_top") or []
            if top:
                evidence.append(
                    "busiest other processes: "
                    + ", ".join(f"{p['name']} (pid {p['pid']}) {p['cpu_cores']:.1f} cores" for p in top)
                )
    if steal is not None and steal >= T["steal_pct"]:
        heads.append(f"the hypervisor stole {steal:.0f}% of the CPU time")
        evidence.append(f"{steal:.0f}% of CPU time was stolen by the hypervisor (other virtual machines on the host)")
    g_frac, g_max = summary.get("gpu_other_process_frac"), summary.get("gpu_other_processes_max")
    if g_frac is not None and g_max and g_frac >= T["gpu_other_process_frac"]:
        heads.append(f"{g_max} other process{'es' if g_max > 1 else ''} on the GPU")
        procs = summary.get("gpu_other_processes") or []
        named = ", ".join(
            f"{p.get('name') or '?'} (pid {p['pid']}"
            + (f", {p['used_mb_max'] / 1024:.1f} GB" if p.get("used_mb_max") is not None else "")
            + ")"
            for p in procs[:3]
        )
        evidence.append(
            f"up to {g_max} other process{'es' if g_max > 1 else ''} held a context on this GPU, in "
            f"{_pct(g_frac)} of the samples"
            + (f": {named}" if named else "")
            + ("; GPU utilisation counts their kernels too" if summary.get("gpu_util_mean") is not None else "")
        )
    if not heads:
        return None
    return "; ".join(heads), evidence


def diagnose(summary: dict[str, Any], *, device_type: str, step_stats: dict[str, Any] | None = None) -> dict:
    """Return {"verdict", "headline", "evidence": [str], "advice": str, "confidence": "high"|"medium"|"low",
    "notes": [str]}.

    `device_type` is "cuda" or "cpu" (anything else is treated like "cpu": no GPU counters). `notes` carries
    what could not be judged, including the monitor's own `not_measured` list.
    """
    if not isinstance(summary, dict):
        raise TypeError(f"diagnose(summary=...) needs the dict from TrainingMonitor.get_summary(), got {type(summary)}")
    if device_type not in ("cuda", "cpu", "mps", "xpu"):
        raise ValueError(f"diagnose(device_type={device_type!r}): expected 'cuda' or 'cpu'")
    st = dict(step_stats or {})
    T = THRESHOLDS
    notes: list[str] = [f"not measured: {m}" for m in summary.get("not_measured") or []]
    evidence: list[str] = []

    dw = summary.get("data_wait_frac")
    it = summary.get("iter_time_s") or {}
    p50 = it.get("p50")
    p50_ms = p50 * 1000 if p50 is not None else None
    sps = summary.get("samples_per_s")
    ranks = int(st.get("world_size") or 1)  # the monitor measures one process: under DDP, say so
    if p50_ms is not None:
        evidence.append(
            f"median step {p50_ms:.1f} ms (p90 {1000 * it.get('p90', 0):.1f} ms)"
            + (f", {sps:.1f} samples/s" if sps else "")
            + (f" per rank (measured on one of {ranks} ranks)" if sps and ranks > 1 else "")
        )
    if dw is None:
        notes.append("data loading not judged: no data-wait timing was logged (log_iteration(..., data_seconds=...))")
    else:
        evidence.append(f"{_pct(dw)} of step time is spent waiting for the next batch")
    cont = contention(summary, st)

    workers = st.get("num_workers")
    edges = _wall_shares(st.get("wall_time"), evidence, notes)
    if edges is not None:
        return edges
    # ---- 1. data loading
    if dw is not None and dw >= T["data_wait_frac"]:
        cores = summary.get("cpu_count_logical") or 1
        proc = summary.get("process_cpu_percent_mean")
        if proc is not None:
            evidence.append(f"training process + loader workers use {proc:.0f}% of one core ({cores} logical cores)")
        if cont is not None:
            evidence += cont[1]
            notes.append("other processes were taking the machine too: the loader may be starved by them")
        if workers == 0 or workers is None:
            advice = (
                "Load batches in parallel: set num_workers > 0 (find the best value with --auto_num_workers), "
                "with pin_memory and persistent_workers; if the dataset fits in memory, cache it once instead "
                "of reading files per sample."
            )
        elif proc is not None and proc >= T["cpu_saturated_frac"] * 100 * cores:
            advice = (
                "The CPU cores are already busy preparing batches: make each sample cheaper (cache/preprocess "
                "the dataset once, hold it in RAM or on the GPU) rather than adding workers."
            )
        else:
            advice = (
                f"Raise num_workers beyond {workers} (measure with --auto_num_workers) and keep pin_memory / "
                "persistent_workers on; if samples are read from disk, cache the dataset once."
            )
        conf = "high" if dw >= 2 * T["data_wait_frac"] else "medium"
        return _out("data-loading bound", evidence, advice, conf, notes)

    boundary = _epoch_boundaries(st, evidence, notes)
    if boundary is not None:
        return boundary
    if device_type == "cuda":
        return _diagnose_gpu(summary, st, evidence, notes, cont, dw is not None)
    return _diagnose_cpu(summary, st, evidence, notes, p50_ms, cont, dw is not None)


def _wall_shares(split: Any, evidence: list[str], notes: list[str]) -> dict | None:
    """`split`: summary.json's wall_time (wall_s, steps_s, validation_s, checkpoints_s, rest_s). Validation or the
    checkpoints, when they took a large share of the wall time."""
    if not isinstance(split, dict) or not split.get("wall_s"):
        return None
    wall = split["wall_s"]
    val, ckpt = split.get("validation_s") or 0.0, split.get("checkpoints_s") or 0.0
    evidence.append(
        f"wall time {wall:.1f} s: steps {_pct((split.get('steps_s') or 0.0) / wall)}, validation {_pct(val / wall)}, "
        f"checkpoints {_pct(ckpt / wall)}, rest {_pct((split.get('rest_s') or 0.0) / wall)}"
    )
    if val / wall >= THRESHOLDS["validation_frac"] and val >= ckpt:
        advice = (
            "Validate less often: leave validation_interval unset (auto spaces validations to about a tenth of the "
            "wall time) or raise it, or val_check_steps; score fewer batches (limit_val_batches); keep the scoring "
            "on the device, with one read per validation."
        )
        return _out("validation bound", evidence, advice, "high", notes, detail=f"{_pct(val / wall)} of the wall time")
    if ckpt / wall >= THRESHOLDS["checkpoint_frac"]:
        advice = (
            "Save less often or off the training thread: a longer checkpoint_interval, --async_checkpoint, "
            "fewer kept checkpoints (save_top_k), or --no-save_best when best.pt is not needed."
        )
        return _out("checkpoint bound", evidence, advice, "high", notes, detail=f"{_pct(ckpt / wall)} of the wall time")
    return None


def _epoch_boundaries(st: dict[str, Any], evidence: list[str], notes: list[str]) -> dict | None:
    """The run's training time outside its steps and validations (`train_s`, `steps_s`, `val_s`), spread over many
    epoch ends (`epochs`): the epoch boundaries themselves are the bottleneck."""
    train_s, steps_s, val_s, epochs = (st.get(k) for k in ("train_s", "steps_s", "val_s", "epochs"))
    if not train_s or steps_s is None or not epochs or epochs < THRESHOLDS["epoch_ends_min"]:
        return None
    between = max(0.0, train_s - steps_s - (val_s or 0.0))
    frac = between / train_s
    if frac < THRESHOLDS["between_steps_frac"]:
        return None
    evidence.append(
        f"{_pct(frac)} of the training time ({between:.1f} s of {train_s:.1f} s) passed between steps, outside "
        f"validation, over {epochs} epoch ends: {1000 * between / epochs:.1f} ms each"
    )
    advice = (
        "Each epoch end starts a new pass over the data (new loader workers unless persistent_workers, a new "
        "order, a log line, a checkpoint when one is due): run the same steps as fewer, longer epochs (more "
        "samples per epoch, or --max_steps), keep persistent_workers on, and leave checkpoint_interval at a "
        "minute or more."
    )
    return _out("epoch-boundary bound", evidence, advice, "medium", notes, detail=f"{_pct(frac)} between steps")


def _contended(evidence: list[str], notes: list[str], cont: tuple[str, list[str]], threads: int = 1) -> dict:
    """`threads`: torch's intra-op threads on a CPU run (1 elsewhere): on shared cores they wait on each other."""
    advice = (
        "Other work shares this machine, so these timings describe its load, not your training code: measure "
        "again when it is idle (or reserve the cores/GPU: a scheduler allocation, taskset, CUDA_VISIBLE_DEVICES) "
        "before changing settings."
    )
    if threads > 1:
        advice = (
            f"Train with one torch thread: --num_threads 1 (TrainConfig(num_threads=1)); this run's {threads} "
            f"threads wait on each other on cores other work holds. " + advice
        )
    return _out("contended", evidence + cont[1], advice, "high", notes, detail=cont[0])


def _undetermined(evidence: list[str], notes: list[str], why: str) -> dict:
    advice = (
        "Time the wait for each batch and pass it as log_iteration(step_seconds, data_seconds=...): the time "
        "from asking the loader for the next batch to having it. Then data loading can be told apart from "
        "compute and launch overhead."
    )
    evidence.append(why)
    return _out("undetermined", evidence, advice, "low", notes, detail="data wait was not measured")


def _diagnose_gpu(
    s: dict,
    st: dict,
    evidence: list[str],
    notes: list[str],
    cont: tuple[str, list[str]] | None,
    dw_known: bool,
) -> dict:
    T = THRESHOLDS
    util = s.get("gpu_util_mean")
    peak, total = s.get("peak_gpu_mem_mb"), s.get("gpu_mem_total_mb")
    retries = s.get("gpu_alloc_retries") or 0
    kps, sps_ = st.get("kernels_per_step"), st.get("syncs_per_step")
    p50_ms = (s.get("iter_time_s") or {}).get("p50")
    p50_ms = p50_ms * 1000 if p50_ms is not None else None
    if util is not None:
        evidence.append(f"GPU utilisation {util:.0f}% on average (NVML: share of time a kernel is running)")
    else:
        notes.append("no GPU utilisation samples (NVML/nvidia-smi unavailable); verdict relies on memory and profile")
    if s.get("gpu_power_w_mean") is not None:
        lim = s.get("gpu_power_limit_w")
        evidence.append(
            f"GPU power {s['gpu_power_w_mean']:.0f} W" + (f" of a {lim:.0f} W limit" if lim else "") + " on average"
        )
    mem_frac = peak / total if peak is not None and total else None
    if mem_frac is not None:
        evidence.append(f"peak allocated GPU memory {peak:.0f} MB = {_pct(mem_frac)} of {total:.0f} MB")
    if kps is not None:
        evidence.append(f"{kps:.0f} GPU kernels per step (profiler)")
    if sps_:
        evidence.append(f"{sps_:.0f} host-device syncs per step (profiler)")

    # ---- 2. memory: capacity first (it caps everything else), then bandwidth
    if (mem_frac is not None and mem_frac >= T["gpu_mem_frac"]) or retries > 0:
        if retries:
            evidence.append(
                f"the CUDA allocator had to free its cache and retry {retries} times (fragmentation/OOM edge)"
            )
        if cont is not None:
            evidence += cont[1]
        advice = (
            "Free memory before anything else: train in bf16 autocast (halves activations), enable activation "
            "checkpointing for the largest blocks, or halve the batch and keep the effective batch with "
            "gradient accumulation (--auto_batch_size does this)."
        )
        return _out("memory bound", evidence, advice, "high" if mem_frac and mem_frac >= 0.95 else "medium", notes)
    # ---- 3. someone else's work on the GPU or the cores feeding it
    if cont is not None:
        return _contended(evidence, notes, cont)
    ew = st.get("elementwise_frac")
    if ew is not None and ew >= T["elementwise_frac"] and (util is None or util >= T["gpu_util_idle"]):
        evidence.append(f"{_pct(ew)} of device time in elementwise/normalisation/copy kernels (bandwidth-limited)")
        advice = (
            "Fuse the elementwise work: torch.compile the model (fuses pointwise ops into few kernels) and train "
            "in bf16 so each byte moved carries twice the values."
        )
        return _out("memory bound", evidence, advice, "medium", notes)

    # ---- 4. host/launch
    many_kernels = kps is not None and kps >= T["kernels_per_step_many"]
    short = p50_ms is not None and p50_ms <= T["short_step_ms"]
    if (util is not None and util < T["gpu_util_idle"]) or (
        util is not None and util < T["gpu_util_busy"] and (many_kernels or (sps_ or 0) > 1 or short)
    ):
        if not dw_known:
            return _undetermined(
                evidence, notes,
                f"the GPU was idle {100 - util:.0f}% of the time; without a data-wait timing that idle time "
                "cannot be split between waiting for batches and launch/sync overhead",
            )  # fmt: skip
        if sps_ and sps_ > 1:
            advice = (
                f"Remove the {sps_:.0f} host-device syncs per step (.item(), .cpu(), printing a tensor, "
                "`if tensor:`): keep the loss on the device and read it every LOG_EVERY steps."
            )
        else:
            advice = (
                "Give the GPU bigger, fewer kernels: raise the batch size (--auto_batch_size finds the largest "
                "that fits) and torch.compile the model (mode='reduce-overhead' adds CUDA graphs)."
            )
        conf = "high" if util is not None and util < T["gpu_util_idle"] / 2 else "medium"
        return _out("host/launch bound", evidence, advice, conf, notes)

    # ---- 5. compute
    if util is None and not dw_known:
        return _undetermined(
            evidence, notes, "neither GPU utilisation nor the data wait was measured, so nothing shows where "
            "the step time goes",
        )  # fmt: skip
    advice = (
        "The GPU is busy: do the same arithmetic faster with bf16 autocast (tensor cores) and TF32 for what "
        "stays in fp32; then torch.compile. More workers or a bigger batch will not help much."
    )
    conf = "high" if util is not None and util >= T["gpu_util_busy"] else "low"
    if util is None:
        notes.append("compute bound by elimination: no utilisation counter to confirm it")
    return _out("compute bound", evidence, advice, conf, notes)


def _diagnose_cpu(
    s: dict,
    st: dict,
    evidence: list[str],
    notes: list[str],
    p50_ms: float | None,
    cont: tuple[str, list[str]] | None,
    dw_known: bool,
) -> dict:
    T = THRESHOLDS
    notes.append(
        "CPU run: computation, Python overhead and data loading share the same cores, and there is no "
        "utilisation counter like a GPU's; this verdict is coarser than on a GPU and does not predict GPU behaviour."
    )
    cores = s.get("cpu_count_logical") or 1
    threads = st.get("torch_threads") or cores
    proc = s.get("process_cpu_percent_mean")
    ram, ram_total = s.get("ram_used_gb_max"), s.get("ram_total_gb")
    if proc is not None:
        evidence.append(
            f"training process + workers use {proc:.0f}% of one core on average "
            f"({threads} torch threads, {cores} logical cores)"
        )
    if ram is not None and ram_total:
        evidence.append(f"peak RAM in use {ram:.1f} of {ram_total:.1f} GB")
        if ram / ram_total >= T["gpu_mem_frac"]:
            advice = (
                "RAM is nearly full (swapping would dominate): lower the batch size and keep the effective batch "
                "with gradient accumulation, or cache the dataset as float16/memory-mapped arrays."
            )
            return _out("memory bound", evidence, advice, "medium", notes)
    if cont is not None:
        return _contended(evidence, notes, cont, int(st.get("torch_threads") or 1))
    if not dw_known:
        why = "without a data-wait timing, time spent loading batches cannot be told from compute"
        if proc is not None and proc < 50:
            why = (
                f"this process used only {proc:.0f}% of one core: most of the step time went to waiting (for data, "
                "I/O, a sleep or a lock), not computing, and no data-wait timing says which"
            )
        elif proc is None:
            why = "neither the data wait nor this process's CPU use was measured"
        return _undetermined(evidence, notes, why)
    kps = st.get("kernels_per_step")
    if kps is not None:
        evidence.append(f"{kps:.0f} operator calls per step (profiler)")
    busy = proc is not None and proc >= T["cpu_saturated_frac"] * 100 * min(threads, cores)
    if not busy and ((p50_ms is not None and p50_ms <= T["short_step_ms"]) or (kps or 0) >= T["kernels_per_step_many"]):
        advice = (
            "Steps are short and the cores are not saturated: per-op Python/dispatcher overhead dominates. "
            "Raise the batch size so each op does more work, or torch.compile the model to fuse ops."
        )
        return _out("host/launch bound", evidence, advice, "low", notes)
    advice = (
        "The cores are doing arithmetic: a GPU is the real fix; on CPU, keep torch threads = physical cores "
        "and try torch.compile (bf16 autocast depends on the CPU: 0.6x fp32 on an AVX512-BF16 EPYC here; measure it)."
    )
    if proc is None:
        notes.append("compute bound by elimination: this process's CPU use was not measured")
    return _out("compute bound", evidence, advice, "medium" if busy else "low", notes)


def _out(
    verdict: str,
    evidence: list[str],
    advice: str,
    confidence: str,
    notes: list[str],
    detail: str | None = None,
) -> dict:
    return {
        "verdict": verdict,
        "headline": f"{verdict}: {detail}" if detail else verdict,
        "evidence": evidence,
        "advice": advice,
        "confidence": confidence,
        "notes": notes,
    }
