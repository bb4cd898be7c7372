#!/usr/bin/env bash
# The GPU check in one command, under 8 minutes on one H100 (data generation included); docs/benchmarks/index.md
# ("GPU (H100), this tree") says what each step does and what it found:
#
#     bash benchmarks/run_gpu.sh
#     TINY=1 bash benchmarks/run_gpu.sh        # dry run: the same steps on the tiny preset, any device
#
# 1. benchmarks.run --preset seed: plainloop's defaults, tuned, Lightning as the guides' BaseTrainer and Lightning on
#    plainloop's own data path, on a generated ERA5-format file on the native 0.25° grid (made once into $CACHE_DIR).
# 2. benchmarks.profile_gap --preset seed: where the GPU idles in a trace of plainloop and Lightning.
# Both write raw JSON and a Markdown table into $OUT_DIR named after the device, each step under a time limit.
# Installs nothing: needs python with torch (CUDA), numpy, netCDF4, psutil; lightning and nvidia-ml-py optional.
#
# Settings (env vars, defaults in brackets):
#   PYTHON        interpreter                      [first of .venv/bin/python, python3, python with CUDA torch]
#   CACHE_DIR     netCDF + coarse cache            [$PLAINLOOP_CACHE or ~/.cache/plainloop]
#   OUT_DIR       where the results go             [benchmarks/results]
#   REPS          interleaved repetitions          [3; 1 when TINY=1]
#   EPOCHS        timed epochs per repetition      [10; the preset's when TINY=1]
#   CONFIGS       benchmarks.run's rows            [defaults,tuned,lightning,lightning_data]
#   COMPILE_MODE  torch.compile mode of "tuned"    [default; none when TINY=1]
#   RUN_LIMIT     seconds for step 1, PROFILE_LIMIT for step 2   [330, 150]
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
CONFIGS=${CONFIGS:-defaults,tuned,lightning,lightning_data}
RUN_LIMIT=${RUN_LIMIT:-330}; PROFILE_LIMIT=${PROFILE_LIMIT:-150}
if [ "$TINY" = 1 ]; then
    PRESET=tiny; REPS=${REPS:-1}; COMPILE_MODE=${COMPILE_MODE:-none}; EPOCHS=${EPOCHS:-1}
    PROFILE_ARGS=(--steps 4 --warmup-epochs 1)
else
    PRESET=seed; REPS=${REPS:-3}; COMPILE_MODE=${COMPILE_MODE:-default}; EPOCHS=${EPOCHS:-10}
    PROFILE_ARGS=()
fi
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
mkdir -p "$OUT_DIR" "$CACHE_DIR"

echo "== environment"
DEV=$("$PYTHON" - <<'EOF'
import importlib.util, re, sys
import torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, GPU {gpu or 'NONE'}",
      file=sys.stderr)
missing = [m for m in ("netCDF4", "lightning", "psutil", "pynvml") if importlib.util.find_spec(m) is None]
if missing:
    print("missing optional modules:", ", ".join(missing), file=sys.stderr)
if need := [m for m in ("netCDF4", "psutil") if m in missing]:
    sys.exit(f"{need[0]} is required (ERA5 files, the monitor): install it, e.g. from a local wheel (pip install --no-index {need[0]})")
if gpu is None:
    print("WARNING: no CUDA device; the run will measure the CPU", file=sys.stderr)
print(re.sub(r"[^a-z0-9]+", "_", (gpu or "cpu").lower()).replace("nvidia_", "").strip("_"))
EOF
)
[ "$TINY" = 1 ] && DEV=tiny
df -h "$CACHE_DIR" | tail -1 | awk '{print "== disk free at cache: " $4 " (the 0.25° file needs ~1.3 GB)"}'
RUN_JSON="$OUT_DIR/run_gpu_$DEV.json"; GAP_JSON="$OUT_DIR/profile_gap_$DEV.json"

echo "== 1. benchmarks.run --preset $PRESET ($CONFIGS, $REPS reps of $EPOCHS epochs; at most $RUN_LIMIT s)"
timeout "$RUN_LIMIT" "$PYTHON" -m benchmarks.run --preset "$PRESET" --configs "$CONFIGS" --reps "$REPS" --epochs "$EPOCHS" \
    --compile-mode "$COMPILE_MODE" --cache-dir "$CACHE_DIR" --out "$RUN_JSON" || \
    echo "benchmarks.run FAILED or ran out of time (exit $?); going on to the profile"

echo "== 2. benchmarks.profile_gap --preset $PRESET (at most $PROFILE_LIMIT s)"
timeout "$PROFILE_LIMIT" "$PYTHON" -m benchmarks.profile_gap --preset "$PRESET" --cache-dir "$CACHE_DIR" \
    ${PROFILE_ARGS[@]+"${PROFILE_ARGS[@]}"} --out "$GAP_JSON" || \
    echo "benchmarks.profile_gap FAILED or ran out of time (exit $?)"

echo "== headline (raw: $RUN_JSON, $GAP_JSON)"
"$PYTHON" - "$RUN_JSON" "$GAP_JSON" <<'EOF'
import json, os, sys
run, gap = sys.argv[1:3]
if os.path.isfile(run):
    r = json.load(open(run)); h = r["headline"]
    x = lambda v, spec=".2f", unit="": "n/a" if v is None else f"{v:{spec}}{unit}"
    print(f"{r['environment']['device_name']}: {h['config']} {x(h['samples_per_s'], '.1f')} samples/s, "
          f"x Lightning seed {x(h['vs_lightning'])} (paired {x(h['vs_lightning_paired'])}), "
          f"x Lightning same data {x(h['vs_lightning_data'])} (paired {x(h['vs_lightning_data_paired'])})")
    for name, s in r["summary"].items():
        print(f"  {name:15s} {s['samples_per_s']['median']:9.1f} samples/s, x Lightning same data "
              f"{x(s['vs_lightning_data'])} (paired {x(s['vs_lightning_data_paired'])})")
if os.path.isfile(gap):
    for name, s in json.load(open(gap))["loops"].items():
        causes = ", ".join(f"{c} {d['ms_per_step']:.2f}" for c, d in s["by_cause"].items())
        print(f"  {name}: busy {s['busy_ms_per_step']['median']:.2f} ms/step ({100 * s['busy_frac']:.0f}%), "
              f"idle ms/step by cause: {causes}")
EOF
