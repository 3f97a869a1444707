"""Where tandem keeps what it builds locally (exported draft models, assembled MTP checkpoints, compiled
native kernels): ``$TANDEM_CACHE_DIR``, else ``$XDG_CACHE_HOME/tandem``, else ``~/.cache/tandem``.
No torch: imported from every layer."""

from __future__ import annotations

import os
from pathlib import Path

from tandem import overrides


def cache_dir() -> Path:
    root = overrides.cache_dir() or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tandem"
    )
    return Path(root)
