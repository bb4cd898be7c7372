#!/usr/bin/env bash
# plainloop launcher: settings from environment variables, then one python or torchrun line.
# With no arguments it sets up .venv and trains the ERA5 SST demo on the built-in sample data.
#   BATCH_SIZE=64 PRECISION=bf16-mixed ./optimize_training.sh --epochs 5
#   NPROC_PER_NODE=4 ./optimize_training.sh                        # one node, 4 GPUs (DDP)
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 NPROC_PER_NODE=8 ./optimize_training.sh
#   MAX_RESTARTS=3 ./optimize_training.sh                          # torchrun restarts a dead worker, from last.pt
#   PLAINLOOP_DRY_RUN=1 ./optimize_training.sh                     # print the environment and command only
# Extra arguments are passed to train_optimized.py (they win over the variables). Relative paths, in the variables
# and in the path flags (--config --resume --data_path --output_dir --cache_dir), are read from the directory you
# ran this from, and runs land under that directory's runs/ (OUTPUT_DIR changes it).
# A bad variable is an error that names it, with exit code 2 (the CLI's code for bad flags).
set -euo pipefail
# a task of your own (TASK=package.module:function) is imported from the directory you ran this from
export PLAINLOOP_CALLER_DIR="${PLAINLOOP_CALLER_DIR:-$PWD}"
caller_dir=$PLAINLOOP_CALLER_DIR
cd "$(dirname "$0")"
repo_dir=$PWD

die() {
  echo "optimize_training.sh: error: $*" >&2
  exit 2
}
note() { echo "[optimize_training.sh] $*" >&2; }

# whole_number NAME MIN [MAX] [WHAT]: empty stays empty (= the default); "08" becomes 8 (not octal)
whole_number() {
  local name=$1 min=$2 max=${3:-} what=${4:-} v
  v=${!name-}
  [ -z "$v" ] && return 0
  local allowed="a whole number >= $min${max:+ and <= $max}${what:+ ($what)}"
  if ! [[ "$v" =~ ^[0-9]+$ ]] || [ "${#v}" -gt 18 ]; then
    die "$name='$v' is not valid: use $allowed, e.g. $name=$((min > 1 ? min : 1))"
  fi
  v=$((10#$v))
  if [ "$v" -lt "$min" ] || { [ -n "$max" ] && [ "$v" -gt "$max" ]; }; then
    die "$name=$v is out of range: use $allowed"
  fi
  printf -v "$name" '%s' "$v"
}

# one_of NAME CHOICE...: empty stays empty (= the default)
one_of() {
  local name=$1 v=${!1-} c
  shift
  [ -z "$v" ] && return 0
  for c in "$@"; do [ "$v" = "$c" ] && return 0; done
  die "$name='$v' is not valid: use one of $*"
}

# plain_text NAME: no control characters (a newline or escape would break the command line or the terminal)
plain_text() {
  local name=$1 v=${!1-}
  case "$v" in *[[:cntrl:]]*) die "$name holds a control character: give a plain value" ;; esac
  return 0
}

# from_caller PATH [input]: a relative PATH is read from the caller's directory; an input that only exists in the
# repository (e.g. configs/era5.toml, as the examples write it) is read from there, with a note
from_caller() {
  local v=$1 kind=${2:-}
  case "$v" in "" | /* | auto) printf '%s' "$v"; return 0 ;; esac
  if [ "$kind" = input ] && [ ! -e "$caller_dir/$v" ] && [ -e "$repo_dir/$v" ]; then
    note "$v: not in $caller_dir; using the repository's $repo_dir/$v"
    printf '%s' "$repo_dir/$v"
    return 0
  fi
  printf '%s' "$caller_dir/$v"
}

# boolean NAME: 1/0, true/false, yes/no in any case -> 1 or 0 (bash 3.2 has no ${v,,}: tr)
boolean() {
  local name=$1 v
  v=$(printf '%s' "${!name-}" | tr '[:upper:]' '[:lower:]')
  case "$v" in
    1 | true | yes) printf -v "$name" 1 ;;
    0 | false | no) printf -v "$name" 0 ;;
    *) die "$name='${!name-}' is not valid: use 1/0, true/false or yes/no" ;;
  esac
}

# Each empty variable leaves train_optimized.py its default (and a resumed run its saved setting).
TASK="${TASK:-}"                            # era5 (SST forecasting, the default), reid, or your package.module:function
BATCH_SIZE="${BATCH_SIZE:-}"                # per GPU; empty = train_optimized.py's default
NUM_WORKERS="${NUM_WORKERS:-}"              # empty = chosen from the CPU count
PRECISION="${PRECISION:-}"                  # auto (default), 32, 16-mixed, bf16-mixed
COMPILE="${COMPILE:-0}"                     # 1/true/yes = torch.compile
COMPILE_MODE="${COMPILE_MODE:-}"            # default, reduce-overhead, max-autotune (with COMPILE=1)
EPOCHS="${EPOCHS:-}"                        # empty = train_optimized.py's default
DATA_PATH="${DATA_PATH:-${ERA5_DATA_PATH:-}}"  # empty = built-in sample data
OUTPUT_DIR="${OUTPUT_DIR:-}"                # default runs
RUN_NAME="${RUN_NAME:-}"                    # empty = a new unique name (fixed once per launch with MAX_RESTARTS)
SEED="${SEED:-}"                            # default 42
NPROC_PER_NODE="${NPROC_PER_NODE:-1}"       # processes (GPUs) per node
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
master_given=$([ -n "${MASTER_ADDR:-}${MASTER_PORT:-}" ] && echo 1 || echo 0)
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
MAX_RESTARTS="${MAX_RESTARTS:-0}"           # >0: torchrun restarts failed workers, which resume from last.pt
SKIP_SETUP="${SKIP_SETUP:-0}"               # 1 = use the current python, do not touch .venv
PLAINLOOP_DRY_RUN="${PLAINLOOP_DRY_RUN:-0}"  # 1 = print the exported variables and the command, run nothing

whole_number NPROC_PER_NODE 1 256 "processes per node, one per GPU"
whole_number NNODES 1 "" "nodes"
whole_number NODE_RANK 0 "$((NNODES - 1))" "this node's index, below NNODES=$NNODES"
whole_number BATCH_SIZE 1 "" "samples per GPU"
whole_number NUM_WORKERS 0 "" "loader processes per GPU"
whole_number EPOCHS 1
whole_number SEED 0 4294967295
whole_number MASTER_PORT 1 65535 "a TCP port"
whole_number MAX_RESTARTS 0 "" "worker restarts torchrun may make"
# MASTER_ADDR goes into torchrun's arguments (and HOST:PORT): a host name, an IPv4 or an IPv6 address, nothing else
host_re='^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$'
ipv6_re='^\[?[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\]?$'
[[ "$MASTER_ADDR" =~ $host_re || "$MASTER_ADDR" =~ $ipv6_re ]] ||
  die "MASTER_ADDR='$(printf '%s' "$MASTER_ADDR" | tr -d '[:cntrl:]' | head -c 80)' is not valid: use the first node's host name or IP address, e.g. MASTER_ADDR=10.0.0.1"
boolean COMPILE
boolean SKIP_SETUP
boolean PLAINLOOP_DRY_RUN
case "${TASK-}" in
  *:*) plain_text TASK ;;  # a user's own task, module:function or path/file.py:function (the CLI checks it)
  *) one_of TASK era5 reid ;;
esac
one_of PRECISION auto 32 16-mixed bf16-mixed
one_of COMPILE_MODE default reduce-overhead max-autotune
for v in RUN_NAME OUTPUT_DIR DATA_PATH; do plain_text "$v"; done
# the same rule as the CLI's --run_name (trainer/config.py run_name_problem): one plain name, at most 120 bytes
case "$RUN_NAME" in
  */* | *\\* | . | ..) die "RUN_NAME='$RUN_NAME' is not valid: use a plain name (no '/', not . or ..); OUTPUT_DIR sets the folder" ;;
  -*) die "RUN_NAME='$RUN_NAME' is not valid: it starts with '-' (it would read as a flag); use a plain name" ;;
esac
[ "$(printf '%s' "$RUN_NAME" | wc -c)" -le 120 ] || die "RUN_NAME is longer than 120 bytes: use a shorter name"
OUTPUT_DIR=$(from_caller "$OUTPUT_DIR")
DATA_PATH=$(from_caller "$DATA_PATH" input)

# Allocator: expandable segments cut fragmentation when batch shapes vary. A setting of the user's always wins:
# PyTorch >= 2.9 reads PYTORCH_ALLOC_CONF and ignores the older PYTORCH_CUDA_ALLOC_CONF when both are set, so
# exporting our default beside the user's older variable would silently override it. Instead the user's value
# is copied to the new name (both then agree, and no deprecation warning); nothing is added to it.
exported=(PYTORCH_ALLOC_CONF)
if [ -n "${PYTORCH_ALLOC_CONF+set}" ]; then
  if [ -n "${PYTORCH_CUDA_ALLOC_CONF+set}" ] && [ "$PYTORCH_CUDA_ALLOC_CONF" != "$PYTORCH_ALLOC_CONF" ]; then
    note "PYTORCH_CUDA_ALLOC_CONF='$PYTORCH_CUDA_ALLOC_CONF' is ignored by PyTorch: PYTORCH_ALLOC_CONF='$PYTORCH_ALLOC_CONF' is set and wins"
  fi
elif [ -n "${PYTORCH_CUDA_ALLOC_CONF+set}" ]; then
  export PYTORCH_ALLOC_CONF="$PYTORCH_CUDA_ALLOC_CONF"
  note "allocator: your PYTORCH_CUDA_ALLOC_CONF='$PYTORCH_CUDA_ALLOC_CONF' is used (also exported as PYTORCH_ALLOC_CONF, the name PyTorch reads first); expandable_segments is not added"
else
  export PYTORCH_ALLOC_CONF="expandable_segments:True"
fi
[ -n "${PYTORCH_CUDA_ALLOC_CONF+set}" ] && exported+=(PYTORCH_CUDA_ALLOC_CONF)

# Elastic restarts: a restarted worker must find the same run directory, so the name is fixed once per launch
# and --resume auto continues it from last.pt (or starts it fresh when it has no checkpoint yet).
if [ "$MAX_RESTARTS" -gt 0 ] && [ -z "$RUN_NAME" ]; then
  label=$(printf '%s' "${TASK:-era5}" | tr -c 'A-Za-z0-9_.-' '-')  # module:function -> a folder name
  if [ "$NNODES" -gt 1 ]; then
    [ -n "${SLURM_JOB_ID:-}" ] || die "MAX_RESTARTS=$MAX_RESTARTS with NNODES=$NNODES needs RUN_NAME set to the same name on every node (or SLURM_JOB_ID)"
    RUN_NAME="$label-slurm$SLURM_JOB_ID"
  else
    RUN_NAME="$label-$(date +%Y%m%d-%H%M%S)-$$"
  fi
  note "MAX_RESTARTS=$MAX_RESTARTS: run name $RUN_NAME (restarted workers resume ${OUTPUT_DIR:-runs}/$RUN_NAME)"
fi
if [ "$MAX_RESTARTS" -gt 0 ]; then
  # Restarted workers sharing torchrun's rendezvous store read the dead workers' stale addresses and fail to
  # connect (seen with torch 2.13 and gloo, every rendezvous backend); a fresh store per attempt avoids it.
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"
  exported+=(TORCH_DISABLE_SHARE_RDZV_TCP_STORE)
fi

args=()
[ -n "$TASK" ] && args+=(--task "$TASK")
[ -n "$PRECISION" ] && args+=(--precision "$PRECISION")
[ -n "$OUTPUT_DIR" ] && args+=(--output_dir "$OUTPUT_DIR")
[ -n "$SEED" ] && args+=(--seed "$SEED")
[ -n "$RUN_NAME" ] && args+=(--run_name "$RUN_NAME")
[ "$MAX_RESTARTS" -gt 0 ] && args+=(--resume auto)
[ -n "$BATCH_SIZE" ] && args+=(--batch_size "$BATCH_SIZE")
[ -n "$NUM_WORKERS" ] && args+=(--num_workers "$NUM_WORKERS")
[ -n "$EPOCHS" ] && args+=(--epochs "$EPOCHS")
[ -n "$DATA_PATH" ] && args+=(--data_path "$DATA_PATH")
[ "$COMPILE" = "1" ] && args+=(--compile_model)
[ "$COMPILE" = "1" ] && [ -n "$COMPILE_MODE" ] && args+=(--compile_mode "$COMPILE_MODE")

if [ "$SKIP_SETUP" = "1" ]; then
  PY=python
  command -v python >/dev/null 2>&1 || PY=python3
elif [ "$PLAINLOOP_DRY_RUN" = "1" ]; then
  PY=python
  note "dry run: would set up .venv with scripts/ensure_venv.sh"
else
  # the runtime only (torch, requirements.txt, plainloop itself); ./run_tests.sh adds the development tools
  PLAINLOOP_NEEDS="${PLAINLOOP_NEEDS:-runtime}"
  source scripts/ensure_venv.sh
  PY=python
fi

cmd=("$PY")
if [ "$NPROC_PER_NODE" -gt 1 ] || [ "$NNODES" -gt 1 ] || [ "$MAX_RESTARTS" -gt 0 ]; then
  # torchrun's own main, through a wrapper: a stop signal to the agent ends it with one line and 128+N, not exit 1
  # and a traceback (run by its path: it needs torch only, not plainloop installed)
  cmd+=("$repo_dir/trainer/cli/torchrun.py" --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE")
  [ "$MAX_RESTARTS" -gt 0 ] && cmd+=(--max_restarts "$MAX_RESTARTS")
  if [ "$NNODES" -eq 1 ] && [ "$master_given" = "0" ]; then
    cmd+=(--standalone)  # a free local port: simultaneous launches on one machine never collide
  elif [ "$NNODES" -gt 1 ] && [ "$MAX_RESTARTS" -gt 0 ]; then
    # PyTorch's fault-tolerant recipe: c10d rendezvous (node ranks are assigned by it; NODE_RANK is not used)
    cmd+=(--rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv_id "$RUN_NAME")
  else
    cmd+=(--node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT")
  fi
fi
# path flags among the extra arguments: relative to the caller's directory, like the variables
extra=()
path_next=""
for a in "$@"; do
  if [ -n "$path_next" ]; then
    extra+=("$(from_caller "$a" "$path_next")")
    path_next=""
    continue
  fi
  case "$a" in
    --config | --resume | --data_path) path_next=input; extra+=("$a") ;;
    --output_dir | --cache_dir) path_next=output; extra+=("$a") ;;
    --config=* | --resume=* | --data_path=*) extra+=("${a%%=*}=$(from_caller "${a#*=}" input)") ;;
    --output_dir=* | --cache_dir=*) extra+=("${a%%=*}=$(from_caller "${a#*=}")") ;;
    *) extra+=("$a") ;;
  esac
done
script=train_optimized.py
# from elsewhere, the script by its full path: the re-run and resume lines a run prints then work where you are
[ "$caller_dir" = "$repo_dir" ] || script="$repo_dir/train_optimized.py"
cmd+=("$script" ${args[@]+"${args[@]}"} ${extra[@]+"${extra[@]}"})
# run where you ran this: the default runs/ is yours, and the run directory it prints is relative to you
cd "$caller_dir"

if [ "$PLAINLOOP_DRY_RUN" = "1" ]; then
  for name in "${exported[@]}"; do
    printf 'export %s=%q\n' "$name" "${!name}"
  done
  printf '%q ' "${cmd[@]}" | sed 's/ $//'
  echo
  exit 0
fi
exec "${cmd[@]}"
