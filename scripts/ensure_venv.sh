# Sourced by optimize_training.sh and run_tests.sh: make .venv and install what the caller needs, one line a phase.
#   PLAINLOOP_NEEDS=runtime  (optimize_training.sh): torch and requirements.txt, to train
#   PLAINLOOP_NEEDS=dev      (run_tests.sh, the default): requirements-dev.txt too (tests, lint, docs, Lightning)
# Either way plainloop itself is installed editable (`import plainloop` and the `plainloop` command in .venv).
# Re-installs only when the requirement files or TORCH_SPEC change (stamp files record them); a .venv set up for
# the tests also serves optimize_training.sh.
# TORCH_SPEC picks the torch build (default torch==2.13.0, a CPU build on CPU-only machines here);
# it is also a pip constraint, so no other package can pull a different (multi-GB CUDA) torch.
set -euo pipefail
PLAINLOOP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$PLAINLOOP_ROOT/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PLAINLOOP_NEEDS="${PLAINLOOP_NEEDS:-dev}"
PYTHON_BIN="${PYTHON_BIN:-python3}"
case "$PLAINLOOP_NEEDS" in
  runtime) reqs="$PLAINLOOP_ROOT/requirements.txt" ;;
  dev) reqs="$PLAINLOOP_ROOT/requirements-dev.txt" ;;
  *)
    echo "ensure_venv.sh: error: PLAINLOOP_NEEDS='$PLAINLOOP_NEEDS' is not valid: use runtime or dev" >&2
    exit 2
    ;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PYTHON_BIN" -m venv "$VENV"
fi
# what each level was installed from; the dev stamp (the older single stamp) covers the runtime level too
dev_stamp="$VENV/.plainloop-stamp"
dev_want="$(cat "$PLAINLOOP_ROOT"/requirements*.txt; echo "$TORCH_SPEC")"
runtime_stamp="$VENV/.plainloop-stamp-runtime"
runtime_want="$(cat "$PLAINLOOP_ROOT/requirements.txt"; echo "$TORCH_SPEC")"
package_stamp="$VENV/.plainloop-stamp-package"
package_want="$(cat "$PLAINLOOP_ROOT/pyproject.toml" "$PLAINLOOP_ROOT/setup.py"; echo "$PLAINLOOP_ROOT")"
same() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

if ! same "$dev_stamp" "$dev_want" && { [ "$PLAINLOOP_NEEDS" = dev ] || ! same "$runtime_stamp" "$runtime_want"; }; then
  echo "[setup] installing $TORCH_SPEC and $(basename "$reqs") into $VENV (pip's progress below)"
  constraints="$(mktemp)"
  echo "$TORCH_SPEC" >"$constraints"
  # setuptools builds the editable install below; Python >= 3.12 makes a venv without it
  build_tool=()
  "$VENV/bin/python" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 64)" \
    2>/dev/null || build_tool=("setuptools>=64")
  # --no-compile: byte-compiling all of torch's files took longer than unpacking them; Python compiles what it imports
  "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar on --no-compile \
    "$TORCH_SPEC" ${build_tool[@]+"${build_tool[@]}"} -r "$reqs" -c "$constraints"
  rm -f "$constraints"
  if [ "$PLAINLOOP_NEEDS" = dev ]; then printf '%s' "$dev_want" >"$dev_stamp"; fi
  printf '%s' "$runtime_want" >"$runtime_stamp"
fi
if ! same "$package_stamp" "$package_want"; then
  echo "[setup] installing plainloop itself, editable (import plainloop; the plainloop command)"
  "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps --no-build-isolation \
    -e "$PLAINLOOP_ROOT"
  printf '%s' "$package_want" >"$package_stamp"
fi
echo "[setup] $VENV is ready ($PLAINLOOP_NEEDS)"
export PATH="$VENV/bin:$PATH"
