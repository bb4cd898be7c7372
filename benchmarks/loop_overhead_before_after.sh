#!/bin/bash
# The loop's own cost before and after a change: benchmarks/loop_overhead.py in a checkout of each commit, run in
# turn (old, new) three times with 5 interleaved repetitions each; then, per loop, the median over the 15
# repetitions of each one's ratio to the hand loop beside it.
#   bash benchmarks/loop_overhead_before_after.sh OLD_COMMIT [NEW_COMMIT (default: HEAD)]
# writes benchmarks/results/loop_overhead_{before,after}_{1,2,3}.json
set -euo pipefail
old=${1:?give the commit to compare with}
new=${2:-HEAD}
root=$(git rev-parse --show-toplevel)
out=$root/benchmarks/results
py=${PYTHON:-$root/.venv/bin/python}
tmp=$(mktemp -d)
git -C "$root" worktree add -f -q --detach "$tmp/before" "$old"
git -C "$root" worktree add -f -q --detach "$tmp/after" "$new"
trap 'git -C "$root" worktree remove -f "$tmp/before"; git -C "$root" worktree remove -f "$tmp/after"; rm -rf "$tmp"' EXIT
for r in 1 2 3; do
  for t in before after; do
    (cd "$tmp/$t" && "$py" -m benchmarks.loop_overhead --reps 5 --loops hand,plainloop,plain_model,basetrainer \
      --out "$out/loop_overhead_${t}_$r.json")
  done
done
PYTHONPATH="$root" "$py" - "$out" <<'PY'
import json, sys
from pathlib import Path

from benchmarks.common import paired, stats

for tree in ("before", "after"):
    runs = [json.loads((Path(sys.argv[1]) / f"loop_overhead_{tree}_{r}.json").read_text()) for r in (1, 2, 3)]
    reps = {n: [v for d in runs for v in d["repetitions"][n]] for n in runs[0]["repetitions"]}
    med = {n: round(paired(v, reps["hand"]), 3) for n, v in reps.items() if n != "hand"}
    print(tree, runs[-1]["environment"]["commit"][:7], med, "hand median samples/s", round(stats(reps["hand"])["median"]))
PY
