"""vLLM's ``FlexibleArgumentParser``: an ``argparse.ArgumentParser`` that also takes ``--flag_name`` for
``--flag-name`` (vLLM's scripts and users spell options both ways)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


class FlexibleArgumentParser(argparse.ArgumentParser):
    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        given = list(sys.argv[1:] if args is None else args)
        fixed = []
        for arg in given:
            if arg.startswith("--") and len(arg) > 2:
                name, eq, value = arg.partition("=")
                arg = name.replace("_", "-") + eq + value
            fixed.append(arg)
        return super().parse_known_args(fixed, namespace)
