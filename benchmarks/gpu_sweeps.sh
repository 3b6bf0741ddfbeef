#!/usr/bin/env bash
# The paper's claims on one GPU in about 6 minutes, three jobs at once:
#   * the masked-LM sweep of the BERT claims:   fixedhead sweep --preset cpu-mlm  (8 models x seeds 0-2)
#   * the causal sweep of the LM1B claims:      fixedhead sweep --preset cpu-clm  (5 models x seeds 2-5, 0, 1)
#   * the LM1B-style pair at d = 256, n = 128:  benchmarks/gpu_lm1b_pair.py
# Each sweep is one command running its points as Ray tasks on the GPU (--workers N, each task a 1/N
# share of the GPU; results.json is rewritten after every finished run), so whatever finishes before
# the deadline is kept, seeds in the order given. The presets are the CPU sweeps' own: same data,
# models, steps.
#
# Usage: benchmarks/gpu_sweeps.sh OUT_DIR [DEADLINE_SECONDS]
#   OUT_DIR gets gpu.txt (machine, versions, each job's exit status), pair.log, pair.json,
#   sweep-mlm.json, sweep-clm.json and workers.log (the end of every job's log). The run folders
#   stay in $RUNS; afterwards: fixedhead report $RUNS/sweep-mlm --output-dir docs/results/sweep-mlm
# Environment: PYTHON (default python3), MLM_WORKERS (8), CLM_WORKERS (5), RUNS (runs/gpu, or
#   runs/gpu-quick with QUICK=1, runs/gpu-lr with LEARNING_RATES), QUICK=1 (CI-sized presets and a
#   3-step pair: checks the script on a CPU in a few minutes; its runs never mix with real ones),
#   LEARNING_RATES=5e-4,1e-3,2e-3,4e-3 (each model of both sweeps chooses its own rate from this grid
#   on a validation split with the first seed, then every seed trains at it: the fair comparison;
#   one task trains a model's grid while the others take other models),
#   MUP_BASE_HEAD_DIM=K (every model of both sweeps under the μP-style parametrization based at d_p = K,
#   runs in $RUNS-mupK; with LEARNING_RATES: the fair comparison under μP).
# Exit status: 0 when both sweep files were written, 1 otherwise (a job that hit the deadline
#   shows status 124 in gpu.txt; its finished runs are still in the sweep file).
set -u
out=${1:?usage: benchmarks/gpu_sweeps.sh OUT_DIR [DEADLINE_SECONDS]}
deadline=${2:-420}
. "$(dirname "$0")/gpu_common.sh" "$out"
quick=()
pair_steps=()
rates=()
[ -n "${LEARNING_RATES:-}" ] && rates=(--learning-rates "$LEARNING_RATES")
mup=()
[ -n "${MUP_BASE_HEAD_DIM:-}" ] && mup=(--mup-base-head-dim "$MUP_BASE_HEAD_DIM")
if [ "${QUICK:-0}" = 1 ]; then
  quick=(--quick)
  pair_steps=(--max-steps 3 --max-eval-tokens 5000)
  runs=${RUNS:-runs/gpu-quick}
elif [ -n "${LEARNING_RATES:-}" ]; then
  runs=${RUNS:-runs/gpu-lr}
else
  runs=${RUNS:-runs/gpu}
fi
[ -n "${MUP_BASE_HEAD_DIM:-}" ] && [ -z "${RUNS:-}" ] && runs=$runs-mup$MUP_BASE_HEAD_DIM
gpu_share() {  # the GPU share of each of N tasks (none on a machine without a GPU: QUICK=1 on a CPU)
  $py -c "import sys, torch; n = int(sys.argv[1]); print(f'--gpus-per-point {1 / n:.4f}' if torch.cuda.is_available() else '')" "$1"
}
mkdir -p "$runs/logs"
rm -f "$out"/{gpu.txt,pair.log,pair.json,sweep-mlm.json,sweep-clm.json,workers.log} "$runs"/logs/*.log

gpu_header "$out/gpu.txt"

start=$(date +%s)
names=()
pids=()
timeout "$deadline" $py benchmarks/gpu_lm1b_pair.py --workers 4 --output-dir "$runs/lm1b-pair" ${pair_steps[@]+"${pair_steps[@]}"} \
  > "$out/pair.log" 2>&1 &
names+=(pair) pids+=($!)
mlm=${MLM_WORKERS:-8} clm=${CLM_WORKERS:-5}
# shellcheck disable=SC2046  # gpu_share prints two words or none
timeout "$deadline" $py -m fixedhead.cli sweep --preset cpu-mlm ${quick[@]+"${quick[@]}"} ${rates[@]+"${rates[@]}"} ${mup[@]+"${mup[@]}"} \
  --workers "$mlm" --threads 1 $(gpu_share "$mlm") --no-progress --output-dir "$runs/sweep-mlm" > "$runs/logs/mlm.log" 2>&1 &
names+=(mlm) pids+=($!)
# shellcheck disable=SC2046
timeout "$deadline" $py -m fixedhead.cli sweep --preset cpu-clm ${quick[@]+"${quick[@]}"} ${rates[@]+"${rates[@]}"} ${mup[@]+"${mup[@]}"} \
  --workers "$clm" --threads 1 $(gpu_share "$clm") --no-progress --seeds 2 3 4 5 0 1 --output-dir "$runs/sweep-clm" \
  > "$runs/logs/clm.log" 2>&1 &
names+=(clm) pids+=($!)
for k in "${!pids[@]}"; do
  wait "${pids[$k]}"
  echo "job ${names[$k]}: exit status $?" >> "$out/gpu.txt"
done
echo "all jobs ended after $(($(date +%s) - start)) s (deadline $deadline s)" >> "$out/gpu.txt"

status=0
for pair in "sweep-mlm:$runs/sweep-mlm/results.json" "sweep-clm:$runs/sweep-clm/results.json" "pair:$runs/lm1b-pair/summary.json"; do
  name=${pair%%:*} src=${pair#*:}
  if [ -f "$src" ]; then
    cp "$src" "$out/$name.json"
  else
    echo "missing: $src" | tee -a "$out/gpu.txt"
    case $name in sweep-*) status=1 ;; esac
  fi
done
for f in "$runs"/logs/*.log; do
  [ -f "$f" ] || continue
  echo "=== $f"
  grep -v -e 'it/s]' -e 's/it]' "$f" | tr -d '\033' | tail -n 25
done > "$out/workers.log"
cat "$out/gpu.txt"
for f in "$out"/sweep-mlm.json "$out"/sweep-clm.json; do
  [ -f "$f" ] && $py -c "import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[1], len(s['runs']), 'runs finished')" "$f"
done
tail -n 12 "$out/pair.log"
exit $status
