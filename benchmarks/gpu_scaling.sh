#!/usr/bin/env bash
# The scaling study's larger points on one GPU: fixedhead scaling --preset gpu (causal LMs, n = 128,
# 4 layers, d = 128...512, standard d_p = 16 against the threshold d_p = 64, each point's learning
# rate chosen on a validation split, 2 seeds, bf16). One command runs the points as Ray tasks, WORKERS
# at once, each with a 1/WORKERS share of the GPU (results.json is rewritten after each point), so
# whatever finishes before the deadline is kept, smallest points first.
#
# Usage: benchmarks/gpu_scaling.sh OUT_DIR [DEADLINE_SECONDS]
#   OUT_DIR gets gpu.txt (machine, versions, the command's exit status), results.json, plan.json, report.md,
#   scaling.png, ranks.png and workers.log (the end of the command's log); the run folders stay
#   in $RUNS/scaling-PRESET.
# Environment: PYTHON (default python3), WORKERS (8: points at once), RUNS (runs/gpu, or
#   runs/gpu-quick with QUICK=1), QUICK=1 (the tiny preset: checks the script on a CPU in a
#   minute; its runs never mix with real ones).
# Exit status: 0 when results.json was written, 1 otherwise.
set -u
out=${1:?usage: benchmarks/gpu_scaling.sh OUT_DIR [DEADLINE_SECONDS]}
deadline=${2:-480}
. "$(dirname "$0")/gpu_common.sh" "$out"
if [ "${QUICK:-0}" = 1 ]; then
  preset=tiny runs=${RUNS:-runs/gpu-quick}
else
  preset=gpu runs=${RUNS:-runs/gpu}
fi
study="$runs/scaling-$preset"
mkdir -p "$runs/logs"
rm -f "$out"/{gpu.txt,results.json,plan.json,report.md,scaling.png,ranks.png,workers.log} "$runs"/logs/scaling-*.log

gpu_header "$out/gpu.txt"

start=$(date +%s)
workers=${WORKERS:-8}
# each task's share of the GPU (none on a machine without one: QUICK=1 on a CPU)
share=$($py -c "import sys, torch; print(f'--gpus-per-point {1 / int(sys.argv[1]):.4f}' if torch.cuda.is_available() else '')" "$workers")
# shellcheck disable=SC2086  # $share is two words or none
timeout "$deadline" $py -m fixedhead.cli scaling --preset "$preset" --workers "$workers" --threads 1 $share --no-progress \
  --output-dir "$study" > "$runs/logs/scaling.log" 2>&1
echo "fixedhead scaling: exit status $?" >> "$out/gpu.txt"
echo "the command ended after $(($(date +%s) - start)) s (deadline $deadline s)" >> "$out/gpu.txt"

status=0
if [ -f "$study/results.json" ]; then
  # the report from everything recorded (a command stopped by the deadline leaves no report of its own)
  $py -c "import sys; from pathlib import Path; from fixedhead.studies.kit.study import options_from_dict, regenerate
from fixedhead.studies.scaling import ScalingStudy, state_of, write_plots
record, report = regenerate(ScalingStudy(), Path(sys.argv[1]))
Path(sys.argv[2], 'report.md').write_text(report)
write_plots(state_of(options_from_dict(ScalingStudy.Options, record['options']), record['runs'].values(), record['meta']), Path(sys.argv[2]))
print(len(record['runs']), 'points finished,', len(record['missing']), 'missing')" "$study" "$out"
  cp "$study/results.json" "$study/plan.json" "$out/"
else
  echo "missing: $study/results.json" | tee -a "$out/gpu.txt"
  status=1
fi
for f in "$runs"/logs/scaling-*.log; do
  [ -f "$f" ] || continue
  echo "=== $f"
  tr -d '\033' < "$f" | tail -n 25
done > "$out/workers.log"
cat "$out/gpu.txt"
exit $status
