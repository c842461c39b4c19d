#!/usr/bin/env bash
# The GPU checks, in one run of a few minutes on one GPU:
#   1. the engine contract on both engines (tests/test_engine_backends.py) with the models on CUDA;
#   2. bench/engine_throughput.py on the GPU (built-in engine against vLLM, tokens/s and RL step time);
#   3. bench/rollout_scheduling.py (the open target: lpt_sibling >= 1.3x FCFS wall time, which a CPU
#      cannot show because its step cost grows with the tokens in the batch; the bench still builds its
#      models on CPU, so this row needs a --device option before it measures the GPU);
#   4. a 100-step `schedrl train` of the demo recipe with a bfloat16 model (the learner's autocast path).
# Everything it prints goes to $OUT (or bench/out/gpu_check) as one log per check.
#
#   bash bench/gpu_check.sh          # on a GPU machine, in a venv with torch (CUDA) and the vllm extra
#   bash bench/gpu_check.sh --dry    # on CPU: the same steps at toy sizes, to check the script itself
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
DRY=0
[ "${1:-}" = "--dry" ] && DRY=1
LOGS=${OUT:-bench/out/gpu_check}
mkdir -p "$LOGS"
if [ "$DRY" = 0 ] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device here: run with --dry to check the script on CPU" >&2
  exit 2
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$LOGS/device.txt"

if [ "$DRY" = 1 ]; then
  DEVICE=cpu
  THROUGHPUT=(--requests 64 --rounds 1 --rl-steps 3)
  SCHEDULING=(--prompts 4 --group 4 --steps 1 --rounds 1 --sft-steps 5 --max-new-tokens 16)
  TRAIN=(--set steps=4 --set sft.steps=4 --set eval.tasks=8 --set model.dtype=float32)
else
  DEVICE=cuda
  THROUGHPUT=(--threads 4)
  SCHEDULING=(--threads 4)
  TRAIN=(--set steps=100 --set model.dtype=bfloat16)
fi

echo "== 1. engine contract, both engines, models on $DEVICE"
SCHEDRL_TEST_DEVICE=$DEVICE "$PY" -m pytest -q -p no:cacheprovider tests/test_engine_backends.py 2>&1 | tail -15 | tee "$LOGS/contract.txt"
echo "== 2. engine throughput"
"$PY" bench/engine_throughput.py "${THROUGHPUT[@]}" --out "$LOGS/runs" 2>&1 | grep -v -E "^(INFO|WARNING|\(MainProcess)" | tail -25 | tee "$LOGS/engine_throughput.txt"
echo "== 3. rollout scheduling (its models are built on CPU: the bench has no device option yet)"
"$PY" bench/rollout_scheduling.py "${SCHEDULING[@]}" 2>&1 | tail -25 | tee "$LOGS/rollout_scheduling.txt"
echo "== 4. schedrl train, demo recipe, ${TRAIN[*]}"
"$PY" -m schedrl.cli train examples/demo.yaml "${TRAIN[@]}" --set out_dir="$LOGS/runs" --set name=train 2>&1 | tail -15 | tee "$LOGS/train.txt"
echo "logs in $LOGS"
