#!/usr/bin/env bash
# plainloop launcher: settings from environment variables, then one python or torchrun line.
# With no arguments it sets up .venv and trains the ERA5 SST demo on the built-in sample data.
#   BATCH_SIZE=64 PRECISION=bf16-mixed ./optimize_training.sh --epochs 5
#   NPROC_PER_NODE=4 ./optimize_training.sh                        # one node, 4 GPUs (DDP)
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 NPROC_PER_NODE=8 ./optimize_training.sh
# Extra arguments are passed to train_optimized.py unchanged (they win over the variables).
set -euo pipefail
cd "$(dirname "$0")"

TASK="${TASK:-era5}"                        # era5 (SST forecasting) or reid
BATCH_SIZE="${BATCH_SIZE:-}"                # per GPU; empty = train_optimized.py's default
NUM_WORKERS="${NUM_WORKERS:-}"              # empty = chosen from the CPU count
PRECISION="${PRECISION:-auto}"              # auto, 32, 16-mixed, bf16-mixed
COMPILE="${COMPILE:-0}"                     # 1 = torch.compile
COMPILE_MODE="${COMPILE_MODE:-default}"     # default, reduce-overhead, max-autotune
EPOCHS="${EPOCHS:-}"                        # empty = train_optimized.py's default
DATA_PATH="${DATA_PATH:-${ERA5_DATA_PATH:-}}"  # empty = built-in sample data
OUTPUT_DIR="${OUTPUT_DIR:-runs}"
SEED="${SEED:-42}"
NPROC_PER_NODE="${NPROC_PER_NODE:-1}"       # processes (GPUs) per node
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
SKIP_SETUP="${SKIP_SETUP:-0}"               # 1 = use the current python, do not touch .venv

# Expandable segments cut fragmentation when batch shapes vary (PyTorch's current allocator setting).
export PYTORCH_ALLOC_CONF="${PYTORCH_ALLOC_CONF:-expandable_segments:True}"

if [ "$SKIP_SETUP" != "1" ]; then
  source scripts/ensure_venv.sh
fi

args=(--task "$TASK" --precision "$PRECISION" --output_dir "$OUTPUT_DIR" --seed "$SEED")
[ -n "$BATCH_SIZE" ] && args+=(--batch_size "$BATCH_SIZE")
[ -n "$NUM_WORKERS" ] && args+=(--num_workers "$NUM_WORKERS")
[ -n "$EPOCHS" ] && args+=(--epochs "$EPOCHS")
[ -n "$DATA_PATH" ] && args+=(--data_path "$DATA_PATH")
[ "$COMPILE" = "1" ] && args+=(--compile_model --compile_mode "$COMPILE_MODE")

if [ "$NPROC_PER_NODE" -gt 1 ] || [ "$NNODES" -gt 1 ]; then
  exec python -m torch.distributed.run --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE" \
    --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    train_optimized.py "${args[@]}" "$@"
fi
exec python train_optimized.py "${args[@]}" "$@"
