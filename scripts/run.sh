#!/usr/bin/env bash
# One command: set everything up, then generate an answer with the default model.
# Extra arguments go to `tandem generate` (e.g. --prompt "..." --max-tokens 64).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ "$#" -eq 0 ]; then
  set -- --prompt "Write a Python function that returns the n-th Fibonacci number." --max-tokens 96 --chat
fi
exec .venv/bin/tandem generate --model smollm2-135m-instruct "$@"
