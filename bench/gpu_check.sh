#!/usr/bin/env bash
# The GPU checks, in one run of under 10 minutes on one GPU:
#   1. the engine contracts on both engines, models on CUDA: tests/test_engine_backends.py (greedy,
#      log-probs, abort/resume, weight swaps, seeds, stops) and tests/test_engine_scheduling.py
#      (admission order, preemptions and pins decided the same inside vLLM's scheduler);
#   2. bench/engine_throughput.py, built-in engine against vLLM, tokens/s at the small preset (25M,
#      float32) and at the 0.5b preset (476M, bfloat16);
#   3. bench/rollout_scheduling.py on the GPU: LPT against FCFS (the 1.3x wall-time target a CPU cannot
#      show, its step cost growing with the tokens in the batch);
#   4. bench/tool_waits.py on the GPU, wall clock: pin against release on long histories, and the
#      virtual clock's fit beside it;
#   5. a 100-step `schedrl train` of the demo recipe with a bfloat16 model (the learner's autocast path).
# With --learner, instead, the learner check alone (bench/learner_gpu.py): the 0.5b preset on one GPU with
# bfloat16 compute, float32 parameters and AdamW state and gradient checkpointing, full and LoRA, peak
# memory and step time; then a checked push into vLLM on the same GPU (buckets with checksums and the
# probe), and an adapter push as a LoRA request with the probe.
# Everything it prints goes to $OUT (or bench/out/gpu_check) as one log per check; each benchmark's last
# line is its JSON, for BENCHMARKS.md with the GPU named (device.txt).
#
#   bash bench/gpu_check.sh          # on a GPU machine, in a venv with torch (CUDA) and the vllm extra
#   bash bench/gpu_check.sh --dry    # on CPU: the same steps at toy sizes, to check the script itself
#   bash bench/gpu_check.sh --learner [--dry]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
DRY=0
LEARNER=0
for arg in "$@"; do
  case "$arg" in
    --dry) DRY=1 ;;
    --learner) LEARNER=1 ;;
    *) echo "unknown option $arg (--dry, --learner)" >&2; exit 2 ;;
  esac
done
LOGS=${OUT:-bench/out/gpu_check}
mkdir -p "$LOGS"
if [ "$DRY" = 0 ] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device here: run with --dry to check the script on CPU" >&2
  exit 2
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$LOGS/device.txt"

if [ "$LEARNER" = 1 ]; then
  if [ "$DRY" = 1 ]; then
    LEARNER_ARGS=(--model tiny --device cpu --steps 1 --tokens 32 --no-vllm)
  else
    LEARNER_ARGS=(--model 0.5b --device cuda --steps 3)
  fi
  echo "== learner on one device: ${LEARNER_ARGS[*]}"
  "$PY" bench/learner_gpu.py "${LEARNER_ARGS[@]}" 2>&1 | grep -v -E "^(INFO|WARNING|\(MainProcess)" | tail -8 | tee "$LOGS/learner.txt"
  echo "logs in $LOGS"
  exit 0
fi

if [ "$DRY" = 1 ]; then
  DEVICE=cpu
  SMALL=(--model tiny --requests 64 --rounds 1 --rl-steps 0)
  LARGE=(--model tiny --dtype bfloat16 --requests 32 --rounds 1 --rl-steps 0 --no-vllm)
  SCHEDULING=(--prompts 4 --group 4 --steps 1 --rounds 1 --sft-steps 5 --max-new-tokens 16)
  WAITS=(--episodes 8 --slots 4 --turns 2 --long-prompt 128 --short-prompt 16 --median-s 0.01 --p99-s 0.05 --policies lockstep release pin)
  TRAIN=(--set steps=4 --set sft.steps=4 --set eval.tasks=8 --set model.dtype=float32)
else
  DEVICE=cuda
  SMALL=(--model small --requests 1024 --rounds 3 --rl-steps 0 --threads 4)
  LARGE=(--model 0.5b --dtype bfloat16 --requests 1024 --rounds 2 --rl-steps 0 --threads 4)
  SCHEDULING=(--threads 4 --device cuda)
  WAITS=(--model small --clock wall --device cuda --threads 4 --policies lockstep release pin pin+priority)
  TRAIN=(--set steps=100 --set model.dtype=bfloat16)
fi

echo "== 1. engine contracts, both engines, models on $DEVICE"
SCHEDRL_TEST_DEVICE=$DEVICE "$PY" -m pytest -q -p no:cacheprovider tests/test_engine_backends.py tests/test_engine_scheduling.py 2>&1 | tail -15 | tee "$LOGS/contract.txt"
echo "== 2. engine throughput: small (float32), then 0.5b (bfloat16)"
"$PY" bench/engine_throughput.py "${SMALL[@]}" --out "$LOGS/runs" 2>&1 | grep -v -E "^(INFO|WARNING|\(MainProcess)" | tail -25 | tee "$LOGS/engine_throughput_small.txt"
"$PY" bench/engine_throughput.py "${LARGE[@]}" --out "$LOGS/runs" 2>&1 | grep -v -E "^(INFO|WARNING|\(MainProcess)" | tail -25 | tee "$LOGS/engine_throughput_0.5b.txt"
echo "== 3. rollout scheduling on $DEVICE: LPT against FCFS"
"$PY" bench/rollout_scheduling.py "${SCHEDULING[@]}" 2>&1 | tail -25 | tee "$LOGS/rollout_scheduling.txt"
echo "== 4. tool waits on $DEVICE: pin against release"
"$PY" bench/tool_waits.py "${WAITS[@]}" 2>&1 | tail -30 | tee "$LOGS/tool_waits.txt"
echo "== 5. schedrl train, demo recipe, ${TRAIN[*]}"
"$PY" -m schedrl.cli train examples/demo.yaml "${TRAIN[@]}" --set out_dir="$LOGS/runs" --set name=train 2>&1 | tail -15 | tee "$LOGS/train.txt"
echo "logs in $LOGS"
