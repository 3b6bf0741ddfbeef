# The GPU scripts' shared set-up, sourced with the output folder: `. benchmarks/gpu_common.sh OUT_DIR`.
# Makes OUT_DIR absolute as $out, moves to the repository root (benchmarks/ and src/ are found from
# there), sets $py ($PYTHON, default python3) with the repository's src/ on its path, and defines
# gpu_header FILE: the machine, versions, cores and date, written to FILE.
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
$py -c "import fixedhead" || { echo "cannot import fixedhead with $py" >&2; exit 1; }

gpu_header() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
    echo "cpu cores: $(nproc)"; date -u; } > "$1" 2>&1
}
