#!/usr/bin/env bash
# The GPU benchmark in one command, on an H100/H200 box (or any CUDA machine):
#
#     bash benchmarks/run_gpu.sh
#
# Runs benchmarks/run.py on the seed's SST configuration (RecursiveAttentionTransformer, 180 x 80 grid at
# 2°, d_model 512, 8 heads, 3 layers, ff 1024, recursion 2) on a generated ERA5-format file on ERA5's
# native 0.25° grid (1440 x 721, 600 months, ~1.3 GB, made once into $CACHE_DIR), then the loop-overhead
# benchmark. Installs nothing: it needs python with torch (CUDA), numpy, netCDF4 and psutil; lightning, tqdm
# and nvidia-ml-py are optional (without lightning its row is skipped with a note; without nvidia-ml-py GPU
# utilisation comes from nvidia-smi).
#
# Settings (env vars, defaults in brackets):
#   PYTHON        interpreter                      [first of .venv/bin/python, python3, python with CUDA torch]
#   CACHE_DIR     netCDF + coarse cache            [$PLAINLOOP_CACHE or ~/.cache/plainloop]
#   OUT           result JSON                      [benchmarks/results/run_gpu.json]
#   REPS          interleaved repetitions          [3]
#   COMPILE_MODE  torch.compile mode of "tuned"    [default; "reduce-overhead" = CUDA graphs]
#   CONFIGS       rows                             [before,defaults,tuned,lightning]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${PYTHON:-}" ]; then  # the first interpreter whose torch sees a GPU (a repo .venv may hold CPU torch)
    for cand in .venv/bin/python python3 python; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
            PYTHON=$cand; break
        fi
    done
    PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
fi
CACHE_DIR=${CACHE_DIR:-${PLAINLOOP_CACHE:-$HOME/.cache/plainloop}}
OUT=${OUT:-benchmarks/results/run_gpu.json}
REPS=${REPS:-3}
COMPILE_MODE=${COMPILE_MODE:-default}
CONFIGS=${CONFIGS:-before,defaults,tuned,lightning}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}

echo "== environment"
"$PYTHON" - <<'EOF'
import importlib.util, sys
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"GPU {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NONE'}")
missing = [m for m in ("netCDF4", "lightning", "psutil", "tqdm", "pynvml") if importlib.util.find_spec(m) is None]
if missing:
    print("missing optional modules:", ", ".join(missing))
required = {"netCDF4": "ERA5 files and the 'before' loop", "psutil": "plainloop's TrainingMonitor (trainer/loop.py)"}
for m, why in required.items():
    if m in missing:
        sys.exit(f"{m} is required ({why}): install it, e.g. from a local wheel (pip install --no-index {m})")
if not torch.cuda.is_available():
    print("WARNING: no CUDA device; the run will measure the CPU")
EOF
mkdir -p "$CACHE_DIR"
df -h "$CACHE_DIR" | tail -1 | awk '{print "== disk free at cache: " $4 " (the 0.25° file needs ~1.3 GB)"}'

echo "== benchmarks.run --preset seed"
"$PYTHON" -m benchmarks.run --preset seed --cache-dir "$CACHE_DIR" --reps "$REPS" \
    --compile-mode "$COMPILE_MODE" --configs "$CONFIGS" --out "$OUT"

echo "== benchmarks.loop_overhead (CPU loop cost on this box)"
"$PYTHON" -m benchmarks.loop_overhead --out "benchmarks/results/loop_overhead_gpu_host.json" || \
    echo "loop_overhead failed (see above); the main table is already written"
