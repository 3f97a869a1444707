#!/usr/bin/env bash
# One command: set everything up, then generate an answer with the default model (or `--model NAME`).
# Extra arguments go to `tandem generate` (e.g. --model gemma-3-270m --prompt "..." --max-tokens 64).
# Without --prompt, a default prompt is used: as a chat for the instruction-tuned default model, as a plain
# completion for any other model (Gemma 3 270M is a base model).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
case " $* " in
  *" --prompt "*|*" --prompt="*) ;;
  *" --model "*|*" --model="*)
    set -- "$@" --prompt "def fibonacci(n: int) -> int:
    \"\"\"Return the n-th Fibonacci number.\"\"\"
" --max-tokens 96 ;;
  *) set -- "$@" --prompt "Write a Python function that returns the n-th Fibonacci number." --max-tokens 96 --chat ;;
esac
exec .venv/bin/tandem generate --model smollm2-135m-instruct "$@"
