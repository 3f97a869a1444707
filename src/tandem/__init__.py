"""tandem: an LLM inference engine with overlapped (async) scheduling and exact speculative decoding."""

from __future__ import annotations

__version__ = "0.1.0"
