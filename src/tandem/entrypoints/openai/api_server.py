"""vLLM's module entry point: ``python -m tandem.entrypoints.openai.api_server [flags]`` is
``tandem serve [flags]`` (the model positional or ``--model``, vLLM's flag spellings)."""

from __future__ import annotations

import sys

from tandem.entrypoints.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
