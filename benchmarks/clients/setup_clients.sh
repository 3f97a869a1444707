#!/usr/bin/env bash
# Real clients nobody here wrote, in their own venv (.venv-clients), never test dependencies: lm-evaluation-harness
# (its local-completions model scores prompts through /v1/completions) and schemathesis (fuzzes every route of
# /openapi.json). ~1 minute; idempotent.
#   benchmarks/clients/setup_clients.sh     then benchmarks/clients/lm_eval_loglikelihood.py and schemathesis_server.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
VENV=.venv-clients
if [ -x "$VENV/bin/lm_eval" ] && [ -x "$VENV/bin/schemathesis" ]; then
  echo "[clients] ready"
  exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
# torch is lm_eval's dependency: the CPU build, pinned like tandem's (an unpinned one pulls CUDA).
"$VENV/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0 "lm_eval[api]==0.4.13" \
  schemathesis==4.32.5 transformers
echo "[clients] ready: lm_eval $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("lm_eval"))'), \
schemathesis $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))')"
