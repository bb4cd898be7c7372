# Sourced by optimize_training.sh and run_tests.sh: make .venv and install what the project needs.
# Re-installs only when the requirement files or TORCH_SPEC change (a stamp file records them).
# TORCH_SPEC picks the torch build (default torch==2.13.0, a CPU build on CPU-only machines here);
# it is also a pip constraint, so no other package can pull a different (multi-GB CUDA) torch.
set -euo pipefail
PLAINLOOP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$PLAINLOOP_ROOT/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
REQS="${REQS:-$PLAINLOOP_ROOT/requirements-dev.txt}"
PYTHON_BIN="${PYTHON_BIN:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PYTHON_BIN" -m venv "$VENV"
fi
stamp="$VENV/.plainloop-stamp"
want="$(cat "$PLAINLOOP_ROOT"/requirements*.txt; echo "$TORCH_SPEC")"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing $TORCH_SPEC and $(basename "$REQS") into $VENV"
  constraints="$(mktemp)"
  echo "$TORCH_SPEC" > "$constraints"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$TORCH_SPEC" -r "$REQS" -c "$constraints"
  rm -f "$constraints"
  printf '%s' "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
