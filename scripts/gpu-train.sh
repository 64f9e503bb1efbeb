#!/usr/bin/env bash
# Train several runs side by side on one GPU, bounded in time; rank them on val and pack the best
# of each direction for the trip back (docs/gpu-training.md).
#
#   bash scripts/gpu-train.sh MINUTES RUNS_FILE DATA_DIR WORK_DIR
#
# RUNS_FILE: one run a line, "name src tgt [train options…]" ('#' starts a comment); the name's
# first four letters group runs by direction (ende-…, deen-…). Every run gets DATA_DIR (train and
# val), --max-minutes MINUTES and the options in $GRID_COMMON (default: CUDA, bf16, one CPU thread,
# up to 100 epochs averaged over the last 5). WORK_DIR/<name>/ holds each run (rerunning resumes
# it), WORK_DIR/<name>.log its output, WORK_DIR/ranking.json the ranking on val greedy BLEU (the
# best epoch or the average of the last ones, whichever scores more), WORK_DIR/packs/<direction>/
# the best run of each direction (python -m export.training.pack), WORK_DIR/DONE the end.
set -u
[ $# -eq 4 ] || { sed -n 2,13p "$0"; exit 2; }
minutes=$1 runs_file=$2 data=$3 work=$4
PYTHON=${PYTHON:-python3}
common=${GRID_COMMON:---device cuda --bf16 --threads 1 --epochs 100 --average-last 5 --keep-last 5}
mkdir -p "$work/packs"
rm -f "$work/DONE"
while read -r name src tgt options; do
  case $name in ''|'#'*) continue ;; esac
  # shellcheck disable=SC2086  # the options are words
  "$PYTHON" -m export.training.train --data-dir "$data" --work-dir "$work/$name" \
    --src-lang "$src" --tgt-lang "$tgt" $common --max-minutes "$minutes" $options \
    >"$work/$name.log" 2>&1 &
done <"$runs_file"
wait
"$PYTHON" - "$work" <<'EOF' >"$work/ranking.json"
import json, sys
from pathlib import Path
rows = []
for h in sorted(Path(sys.argv[1]).glob("*/history.json")):
    history = json.loads(h.read_text())
    best = max(history, key=lambda r: r["val_bleu_greedy"])
    avg = h.parent / "averaged.json"
    averaged = json.loads(avg.read_text())["val_bleu_greedy"] if avg.is_file() else -1.0
    rows.append({
        "run": h.parent.name, "epochs": len(history), "best_epoch": best["epoch"],
        "best": round(best["val_bleu_greedy"], 2), "averaged": round(averaged, 2),
        "pick": "averaged.safetensors" if averaged >= best["val_bleu_greedy"] else "best.safetensors",
        "score": round(max(averaged, best["val_bleu_greedy"]), 2),
        "epoch_seconds": history[-1].get("epoch_seconds"),
        "train_seconds": round(sum(r.get("train_seconds", 0) for r in history), 1),
    })
print(json.dumps(sorted(rows, key=lambda r: -r["score"]), indent=1))
EOF
"$PYTHON" - "$work/ranking.json" <<'EOF' | while read -r direction run pick; do
import json, sys
seen = set()
for row in json.load(open(sys.argv[1])):
    if row["run"][:4] not in seen:
        seen.add(row["run"][:4])
        print(row["run"][:4], row["run"], row["pick"])
EOF
  "$PYTHON" -m export.training.pack "$work/$run" --checkpoint "$pick" --out "$work/packs/$direction"
done
echo done >"$work/DONE"
cat "$work/ranking.json"
