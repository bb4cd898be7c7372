#!/usr/bin/env bash
# The GPU benchmark in one command, on an H100/H200 box (or any CUDA machine):
#
#     bash benchmarks/run_gpu.sh
#     TINY=1 bash benchmarks/run_gpu.sh        # dry run: the same steps on the tiny preset, any device, ~1 min
#
# Runs benchmarks/run.py on the seed's SST configuration (RecursiveAttentionTransformer, 180 x 80 grid at
# 2°, d_model 512, 8 heads, 3 layers, ff 1024, recursion 2) on a generated ERA5-format file on ERA5's
# native 0.25° grid (1440 x 721, 600 months, ~1.3 GB, made once into $CACHE_DIR): before, plainloop defaults,
# plainloop on the seed's loader, tuned (torch.compile + autotuned batch), a user's own model through Trainer
# and BaseTrainer, Lightning as seed 000's BaseTrainer and Lightning on plainloop's data path. Then the host
# cost per step (benchmarks/host_cost.py: kernel launches and syncs per step on this GPU) and the loop-overhead
# benchmark. Installs nothing: it needs python with torch (CUDA), numpy, netCDF4 and psutil; lightning, tqdm
# and nvidia-ml-py are optional (without lightning its rows are skipped with a note; without nvidia-ml-py GPU
# utilisation comes from nvidia-smi).
#
# Every figure docs/benchmarks/index.md's GPU section quotes ends up in $OUT_DIR/run_gpu.json ("headline": × before,
# × Lightning for both Lightning rows, MFU of the measured bf16 peak, GPU utilisation, data wait, the seed's
# 500-epoch job extrapolated) and its rendered table run_gpu.md; the script prints the headline at the end.
#
# Settings (env vars, defaults in brackets):
#   PYTHON        interpreter                      [first of .venv/bin/python, python3, python with CUDA torch]
#   CACHE_DIR     netCDF + coarse cache            [$PLAINLOOP_CACHE or ~/.cache/plainloop]
#   OUT_DIR       where the results go             [benchmarks/results]
#   OUT_JSON      the main result JSON             [$OUT_DIR/run_gpu.json; run_tiny.json when TINY=1]
#   REPS          interleaved repetitions          [3; 1 when TINY=1]
#   COMPILE_MODE  torch.compile mode of "tuned"    [default; "reduce-overhead" = CUDA graphs; none when TINY=1]
#   CONFIGS       rows                             [the seed preset's; before,defaults,tuned,lightning,
#                                                   lightning_data when TINY=1]
#   TINY          1 = dry run on the tiny preset   [0]
set -euo pipefail
cd "$(dirname "$0")/.."

TINY=${TINY:-0}
if [ -z "${PYTHON:-}" ]; then  # the first interpreter whose torch sees a GPU (a repo .venv may hold CPU torch)
    for cand in .venv/bin/python python3 python; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
            PYTHON=$cand; break
        fi
    done
    PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
fi
CACHE_DIR=${CACHE_DIR:-${PLAINLOOP_CACHE:-$HOME/.cache/plainloop}}
OUT_DIR=${OUT_DIR:-benchmarks/results}
if [ "$TINY" = 1 ]; then
    PRESET=tiny; REPS=${REPS:-1}; COMPILE_MODE=${COMPILE_MODE:-none}
    CONFIGS=${CONFIGS:-before,defaults,tuned,lightning,lightning_data}
    OUT_JSON=${OUT_JSON:-$OUT_DIR/run_tiny.json}
    LOOP_ARGS=(--steps 200 --warmup 100 --reps 1 --loops hand,plainloop)
    HOST_ARGS=(--quick)
else
    PRESET=seed; REPS=${REPS:-3}; COMPILE_MODE=${COMPILE_MODE:-default}
    CONFIGS=${CONFIGS:-}
    OUT_JSON=${OUT_JSON:-$OUT_DIR/run_gpu.json}
    LOOP_ARGS=()
    HOST_ARGS=(--configs cpu,seed)
fi
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
mkdir -p "$OUT_DIR" "$CACHE_DIR"

echo "== environment"
"$PYTHON" - <<'EOF'
import importlib.util, sys
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"GPU {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NONE'}")
missing = [m for m in ("netCDF4", "lightning", "psutil", "tqdm", "pynvml") if importlib.util.find_spec(m) is None]
if missing:
    print("missing optional modules:", ", ".join(missing))
required = {"netCDF4": "ERA5 files and the 'before' loop", "psutil": "the TrainingMonitor (utils/performance_monitor.py)"}
for m, why in required.items():
    if m in missing:
        sys.exit(f"{m} is required ({why}): install it, e.g. from a local wheel (pip install --no-index {m})")
if not torch.cuda.is_available():
    print("WARNING: no CUDA device; the run will measure the CPU")
EOF
df -h "$CACHE_DIR" | tail -1 | awk '{print "== disk free at cache: " $4 " (the 0.25° file needs ~1.3 GB)"}'

echo "== benchmarks.run --preset $PRESET"
run_args=(--preset "$PRESET" --cache-dir "$CACHE_DIR" --reps "$REPS" --compile-mode "$COMPILE_MODE" --out "$OUT_JSON")
[ -n "$CONFIGS" ] && run_args+=(--configs "$CONFIGS")
"$PYTHON" -m benchmarks.run "${run_args[@]}"

echo "== benchmarks.host_cost (operators, kernel launches and syncs per step)"
"$PYTHON" -m benchmarks.host_cost ${HOST_ARGS[@]+"${HOST_ARGS[@]}"} --cache-dir "$CACHE_DIR" --out "$OUT_DIR/host_cost_$([ "$TINY" = 1 ] && echo tiny || echo gpu).json" || \
    echo "host_cost failed (see above); the main table is already written"

echo "== benchmarks.loop_overhead (the loop's own cost on this box's CPU)"
"$PYTHON" -m benchmarks.loop_overhead ${LOOP_ARGS[@]+"${LOOP_ARGS[@]}"} --out "$OUT_DIR/loop_overhead_$([ "$TINY" = 1 ] && echo tiny || echo gpu_host).json" || \
    echo "loop_overhead failed (see above); the main table is already written"

echo "== headline (what docs/benchmarks/index.md quotes; raw: $OUT_JSON)"
"$PYTHON" - "$OUT_JSON" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
h = r["headline"]
def x(v, spec=".2f", unit=""):
    return "n/a" if v is None else f"{v:{spec}}{unit}"
print(f"{r['environment']['device_name']}: {h['config']} {x(h['samples_per_s'], '.1f')} samples/s")
print(f"  x before {x(h['vs_before'])} (paired {x(h['vs_before_paired'])}), x Lightning seed {x(h['vs_lightning'])} "
      f"(paired {x(h['vs_lightning_paired'])}), x Lightning same data {x(h['vs_lightning_data'])} "
      f"(paired {x(h['vs_lightning_data_paired'])})")
mfu = None if h["mfu"] is None else 100 * h["mfu"]
wait = None if h["data_wait_frac"] is None else 100 * h["data_wait_frac"]
print(f"  MFU {x(mfu, '.1f', '%')} of the measured {r['peak']['dtype']} peak, GPU util {x(h['gpu_util_mean'], '.0f', '%')}, "
      f"data wait {x(wait, '.2f', '%')}, seed job (500 epochs) {x(h['job_s'], '.0f', ' s')}")
for t in r["targets"]:
    print(f"  target {t['target']}: {'met' if t['met'] else 'MISSED'}")
EOF
