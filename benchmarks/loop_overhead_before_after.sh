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
"$py" - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
for tree in ("before", "after"):
    ratios: dict[str, list[float]] = {}
    hand: list[float] = []
    for r in (1, 2, 3):
        d = json.loads((out / f"loop_overhead_{tree}_{r}.json").read_text())
        reps = d["repetitions"]
        hand += reps["hand"]
        for name, values in reps.items():
            if name != "hand":
                ratios.setdefault(name, []).extend(a / b for a, b in zip(values, reps["hand"]))
    med = {n: round(statistics.median(v), 3) for n, v in ratios.items()}
    print(tree, d["environment"]["commit"][:7], med, "hand median samples/s", round(statistics.median(hand)))
PY
