#!/usr/bin/env bash
# The device calls of a GPU session (docs/gpu-check.md, docs/gpu-training.md), one step a call:
#
#   bash scripts/gpu-session.sh start [MINUTES]  call 1: keep the carried parts, report the machine,
#                                                start the training grid detached (when .gpu-train
#                                                was carried), MINUTES a run (default 5.5)
#   bash scripts/gpu-session.sh part             calls 2-12: keep the carried part; the grid's progress
#   bash scripts/gpu-session.sh check            the check without its speed stage, results in $OUT
#   bash scripts/gpu-session.sh speed            wait for the grid, its ranking and packs into $OUT,
#                                                then the speed stage alone, its results as $OUT/speed.tgz
#
# The speed stage waits for the grid so that training does not share the GPU with the figures.
set -u
step=${1:-}
parts=${TSERVE_PARTS:-/tmp/tserve-parts} runs=${TSERVE_RUNS:-/tmp/runs}
keep_parts() {
  mkdir -p "$parts" && cp -u .wheelhouse/py3.12-parts/* "$parts/" 2>/dev/null
  mkdir -p .wheelhouse/py3.12-parts && cp -u "$parts"/* .wheelhouse/py3.12-parts/
  echo "parts here: $(ls "$parts" | wc -l)"
}
progress() {
  for f in "$runs"/*.log; do
    [ -f "$f" ] && echo "$(basename "$f") $(grep '^{"epoch"' "$f" | tail -1 | cut -c1-120)"
  done
}
case $step in
  start)
    keep_parts
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())'
    if [ -f .gpu-train/runs.txt ]; then
      mkdir -p /tmp/gpu-train/src && cp -r .gpu-train/* /tmp/gpu-train/ && cp -r export service scripts /tmp/gpu-train/src/
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/gpu-train/wheels/*.whl || exit 1
      (cd /tmp/gpu-train/src && PYTHONPATH=/tmp/site:/tmp/gpu-train/src PYTHONUNBUFFERED=1 setsid nohup \
        bash scripts/gpu-train.sh "${2:-5.5}" /tmp/gpu-train/runs.txt /tmp/gpu-train/data "$runs" \
        >/tmp/grid.log 2>&1 </dev/null &)
      sleep 20 && progress
    fi ;;
  part)
    keep_parts && progress ;;
  check)
    keep_parts
    export PYTHONUNBUFFERED=1 && set -o pipefail
    python3 -m benchmarks.gpu.check --data-dir .gpu-check/data --out "$OUT" --skip speed 2>&1 | tee "$OUT/gpu-check.log"
    progress ;;
  speed)
    export PYTHONUNBUFFERED=1
    if [ -d "$runs" ]; then
      for _ in $(seq 150); do [ -f "$runs/DONE" ] && break; sleep 2; done
      tail -30 /tmp/grid.log
      cp "$runs/ranking.json" "$OUT/" 2>/dev/null
      for d in ende deen; do
        for f in "$runs/packs/$d"/*; do [ -f "$f" ] && cp "$f" "$OUT/$d-$(basename "$f")"; done
      done
      pkill -f export.training.train
    fi
    mkdir -p /tmp/speed-out
    timeout 360 python3 -m benchmarks.gpu.check --data-dir .gpu-check/data --out /tmp/speed-out \
      --skip export tests quality 2>&1 | tee /tmp/speed-out/gpu-check.log
    tar -C /tmp/speed-out -czf "$OUT/speed.tgz" . && ls -l "$OUT" ;;
  *)
    sed -n 2,12p "$0"; exit 2 ;;
esac
