#!/usr/bin/env bash
# The paper's claims on one GPU in about 8 minutes, three jobs at once:
#   * the masked-LM sweep of the BERT claims:   fixedhead sweep --preset cpu-mlm  (8 models x seeds 0-2)
#   * the causal sweep of the LM1B claims:      fixedhead sweep --preset cpu-clm  (5 models x seeds 2-5, 0, 1)
#   * the LM1B-style pair at d = 256, n = 128:  benchmarks/gpu_lm1b_pair.py
# Each sweep runs as several workers sharing one output folder (a worker skips a run another holds;
# sweep.json is rewritten after every finished run), so whatever finishes before the deadline is
# kept, seeds in the order given. The presets are the CPU sweeps' own: same data, models, steps.
#
# Usage: benchmarks/gpu_sweeps.sh OUT_DIR [DEADLINE_SECONDS]
#   OUT_DIR gets gpu.txt, pair.log, pair.json, sweep-mlm.json, sweep-clm.json and workers.log;
#   afterwards: fixedhead report DIR_WITH_sweep.json --output-dir docs/results/...
# Environment: PYTHON (default python3), MLM_WORKERS (8), CLM_WORKERS (5), RUNS (runs/gpu),
#   QUICK=1 (CI-sized presets and a 3-step pair: checks the script on a CPU in about a minute).
set -u
out=${1:?usage: benchmarks/gpu_sweeps.sh OUT_DIR [DEADLINE_SECONDS]}
deadline=${2:-420}
py=${PYTHON:-python3}
runs=${RUNS:-runs/gpu}
mkdir -p "$out" "$runs/logs"
export PYTHONUNBUFFERED=1
quick=()
pair_steps=()
if [ "${QUICK:-0}" = 1 ]; then quick=(--quick); pair_steps=(--max-steps 3 --max-eval-tokens 20000); fi

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
  nproc; date -u; } > "$out/gpu.txt" 2>&1

start=$(date +%s)
timeout "$deadline" $py benchmarks/gpu_lm1b_pair.py --output-dir "$runs/lm1b-pair" "${pair_steps[@]}" \
  > "$out/pair.log" 2>&1 &
for i in $(seq 1 "${MLM_WORKERS:-8}"); do
  timeout "$deadline" $py -m fixedhead.cli sweep --preset cpu-mlm "${quick[@]}" --threads 1 --no-report \
    --output-dir "$runs/sweep-mlm" > "$runs/logs/mlm-$i.log" 2>&1 &
  sleep 1  # the first worker claims the folder before the others look at it
done
for i in $(seq 1 "${CLM_WORKERS:-5}"); do
  timeout "$deadline" $py -m fixedhead.cli sweep --preset cpu-clm "${quick[@]}" --threads 1 --no-report \
    --seeds 2 3 4 5 0 1 --output-dir "$runs/sweep-clm" > "$runs/logs/clm-$i.log" 2>&1 &
  sleep 1
done
wait
echo "all jobs ended after $(($(date +%s) - start)) s (deadline $deadline s)" >> "$out/gpu.txt"

cp "$runs/sweep-mlm/sweep.json" "$out/sweep-mlm.json" 2>/dev/null
cp "$runs/sweep-clm/sweep.json" "$out/sweep-clm.json" 2>/dev/null
cp "$runs/lm1b-pair/summary.json" "$out/pair.json" 2>/dev/null
for f in "$runs"/logs/*.log; do
  echo "=== $f"
  grep -v -e 'it/s]' -e 's/it]' "$f" | tail -n 25
done > "$out/workers.log"
cat "$out/gpu.txt"
for f in "$out"/sweep-*.json; do
  $py -c "import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[1], len(s['runs']), 'runs finished')" "$f"
done
tail -n 12 "$out/pair.log"
