"""vLLM's ``speculative_config``: which proposer, how many drafts, and the proposer's own settings; validated at
construction. vLLM's other keys are answered in ``tandem.vllm_args`` (``translate_speculative``). No I/O, no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tandem import vllm_args

_DRAFT_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8", "q8_0")
_SPEC_METHODS = ("ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp")
SPEC_POLICIES = ("adaptive", "fixed")
MAX_SPECULATIVE_TOKENS = 32  # a sanity bound; suffix decoding's default (its tree depth, as vLLM's) is 24


def positive(name: str, value: Any, *, allow_none: bool = False) -> None:
    """A positive integer (or None where allowed); the ValueError names the field. Shared with tandem.config."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


TREE_METHODS = ("eagle", "eagle3", "mtp")
MAX_TREE_ROWS = 63  # verified nodes, and draft-head rows, a request (a tree step's mask has 64 bits)


def tree_expansions(top_k: int, depth: int, max_nodes: int) -> tuple[int, ...]:
    """Nodes expanded (draft-head rows) at each level 1 .. depth - 1 of a draft tree: the best
    ``min(top_k, max_nodes - d)`` of level d. Expanding another could add no verified node: a child of a
    level-d node outside the best e of its level is outranked by its d - 1 ancestors, its parent and those e
    nodes (scores only fall along a path; a shallower node wins a tie), so with ``e >= max_nodes - d`` it is
    never among the ``max_nodes`` verified (nor are its descendants) — it could only take the next level's
    expansion from a node that can be. Small trees save head rows (2 wide, 3 nodes, depth 3: 2 + 1 rows, not
    2 + 2); larger ones expand ``top_k`` a level, as EAGLE-2 does."""
    return tuple(min(top_k, max_nodes - d) for d in range(1, depth))


HEAD_METHODS = ("eagle", "eagle3", "mtp")  # the methods whose drafter is a head with its own matrices


def resolve_draft_weights(draft_dtype: str | None, mixed: bool, block_activations: str | None) -> str:
    """What a draft head's matrices become (``draft_dtype``; the one rule ``spec_decode/eagle.py`` builds by and
    ``tandem config`` shows): ``"q8_0"`` (GGUF Q8_0 blocks run by the block kernels), ``"int8"`` (a scale per
    output feature), ``"target"`` (the target's dtype) or the explicit dtype asked. ``mixed``: whether the
    target is float32 on the native CPU kernels that take lower-precision weights; ``block_activations``: what
    the target's interleaved GGUF products quantize their inputs to (None: no such products).
    ``auto``: q8_0 where those products take int8 activations (VNNI), else int8 where ``mixed``, else the target's."""
    want = draft_dtype or "auto"
    if want != "auto":
        return want
    if not mixed:
        return "target"
    return "q8_0" if block_activations in ("int8", "int8x2") else "int8"


@dataclass(frozen=True)
class TreeConfig:
    """``speculative_config.tree``: draft trees instead of chains (EAGLE-2's dynamic trees, methods eagle,
    eagle3 and mtp). ``top_k`` children of every expanded node, up to ``top_k`` nodes expanded a level
    (:func:`tree_expansions`), the ``max_nodes`` most probable verified; the depth is
    ``num_speculative_tokens``."""

    top_k: int
    max_nodes: int

    def created(self, depth: int) -> int:
        """Nodes a tree of this depth would create expanding ``top_k`` nodes a level (``top_k`` on level 1,
        ``top_k**2`` on each later one): the shape is valid when this reaches ``max_nodes``."""
        return self.top_k + (depth - 1) * self.top_k * self.top_k

    def head_rows(self, depth: int) -> int:
        """Draft-head rows a request's tree takes (:func:`tree_expansions`)."""
        return sum(tree_expansions(self.top_k, depth, self.max_nodes))

    def check(self, depth: int) -> None:
        positive("speculative_config.tree.top_k", self.top_k)
        positive("speculative_config.tree.max_nodes", self.max_nodes)
        if self.max_nodes > self.created(depth):
            raise ValueError(f"speculative_config.tree.max_nodes {self.max_nodes}: a tree of top_k {self.top_k} and "
                             f"depth {depth} (num_speculative_tokens) creates only {self.created(depth)} nodes")
        if self.max_nodes < depth:
            raise ValueError(f"speculative_config.tree.max_nodes {self.max_nodes} must be at least the depth, "
                             f"num_speculative_tokens {depth}")
        if self.max_nodes > MAX_TREE_ROWS or self.head_rows(depth) > MAX_TREE_ROWS:
            raise ValueError(f"speculative_config.tree: at most {MAX_TREE_ROWS} verified nodes and draft-head rows "
                             f"a request (max_nodes {self.max_nodes}, head rows {self.head_rows(depth)})")


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``speculative_config`` keys."""

    method: str
    num_speculative_tokens: int
    model: str | None = None  # draft checkpoint; None: the shipped one for the default model
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    # draft_model: the draft model's dtype (auto: the target's). eagle / eagle3 / mtp: the head's own
    # matrices ("int8": the decoder layer's and an own LM head weight-only int8 with a scale per output
    # feature, the input fusion bf16; "q8_0": the same matrices in GGUF Q8_0 blocks (a scale per 32
    # weights), multiplied by the target's block kernels with its activations; "bfloat16"; auto: q8_0 under
    # a GGUF target whose products take int8 activations (VNNI), int8 under another float32 target on the
    # native CPU kernels, else the target's dtype).
    draft_dtype: str | None = None
    eagle3_layer_ids: tuple[int, ...] | None = None
    # How many drafts each request verifies per step (core/spec_policy.py): "adaptive" chooses 0 ..
    # num_speculative_tokens from measured acceptance and step cost; "fixed" always num_speculative_tokens.
    policy: str = "adaptive"
    # method "suffix" (spec_decode/suffix.py), vLLM's keys: the longest context matched; how many finished
    # requests' outputs stay in the global index (vLLM's default is 10000; each cached output token costs
    # about 100 bytes per context length, so tandem keeps 256 unless asked); drafts at most this factor x the
    # match length; drafting stops once the drafts' estimated probability falls below this.
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 256
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    # Draft trees (methods eagle, eagle3, mtp): ``{"top_k": ..., "max_nodes": ...}``; None: a chain of drafts.
    tree: TreeConfig | None = None

    def __post_init__(self) -> None:
        if self.method not in _SPEC_METHODS:
            raise ValueError(
                f"speculative_config.method must be one of {_SPEC_METHODS}, got {self.method!r}"
            )
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                "speculative_config.num_speculative_tokens must be an integer in "
                f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}"
            )
        if self.method == "ngram":
            lo = self.prompt_lookup_min if self.prompt_lookup_min is not None else 1
            hi = self.prompt_lookup_max if self.prompt_lookup_max is not None else max(lo, 4)
            positive("speculative_config.prompt_lookup_min", lo)
            positive("speculative_config.prompt_lookup_max", hi)
            if lo > hi:
                raise ValueError(
                    f"speculative_config.prompt_lookup_min ({lo}) must not exceed "
                    f"prompt_lookup_max ({hi})"
                )
        positive("speculative_config.suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth)
        n = self.suffix_decoding_max_cached_requests
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"speculative_config.suffix_decoding_max_cached_requests must be an integer >= 0, got {n!r}")
        f = self.suffix_decoding_max_spec_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0:
            raise ValueError(f"speculative_config.suffix_decoding_max_spec_factor must be a number > 0, got {f!r}")
        p = self.suffix_decoding_min_token_prob
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"speculative_config.suffix_decoding_min_token_prob must be in [0, 1], got {p!r}")
        if self.policy not in SPEC_POLICIES:
            raise ValueError(f"speculative_config.policy must be one of {SPEC_POLICIES}, got {self.policy!r}")
        if self.tree is not None:
            if not isinstance(self.tree, TreeConfig):
                raise ValueError(f"speculative_config.tree must be {{'top_k': ..., 'max_nodes': ...}}, got {self.tree!r}")
            if self.method not in TREE_METHODS:
                raise ValueError(f"speculative_config.tree: draft trees need a draft head (methods {TREE_METHODS}), "
                                 f"not {self.method!r}")
            self.tree.check(k)
        if self.draft_dtype is not None and self.draft_dtype not in _DRAFT_DTYPES:
            raise ValueError(f"speculative_config.draft_dtype must be one of {_DRAFT_DTYPES}")
        if self.draft_dtype in ("int8", "q8_0") and self.method not in ("eagle", "eagle3", "mtp"):
            raise ValueError(
                f"speculative_config.draft_dtype {self.draft_dtype!r} (weight-only, a draft head's matrices) "
                f"applies to methods eagle, eagle3 and mtp, not {self.method!r}"
            )

    @property
    def ngram_min(self) -> int:
        return self.prompt_lookup_min if self.prompt_lookup_min is not None else 1

    @property
    def ngram_max(self) -> int:
        if self.prompt_lookup_max is not None:
            return self.prompt_lookup_max
        return max(self.ngram_min, 4)

    @classmethod
    def from_any(cls, value: SpeculativeConfig | dict[str, Any] | str | None) -> SpeculativeConfig | None:
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"speculative_config is not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ValueError("speculative_config must be a dict, a JSON string or SpeculativeConfig")
        known = set(cls.__dataclass_fields__)
        value, _ = vllm_args.translate_speculative(value, known)
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; known: {sorted(known)}")
        if "method" not in value:
            raise ValueError("speculative_config needs 'method' and 'num_speculative_tokens'")
        kwargs = dict(value)
        if "num_speculative_tokens" not in kwargs:
            if kwargs["method"] != "suffix":
                raise ValueError("speculative_config needs 'method' and 'num_speculative_tokens'")
            # as vLLM: suffix decoding drafts up to its tree depth unless told otherwise
            kwargs["num_speculative_tokens"] = kwargs.get("suffix_decoding_max_tree_depth",
                                                          cls.suffix_decoding_max_tree_depth)
        tree = kwargs.get("tree")
        if isinstance(tree, dict):
            extra = sorted(set(tree) - {"top_k", "max_nodes"})
            if extra or not {"top_k", "max_nodes"} <= set(tree):
                raise ValueError(f"speculative_config.tree needs exactly 'top_k' and 'max_nodes', got {sorted(tree)}")
            kwargs["tree"] = TreeConfig(tree["top_k"], tree["max_nodes"])
        if kwargs.get("eagle3_layer_ids") is not None:
            kwargs["eagle3_layer_ids"] = tuple(kwargs["eagle3_layer_ids"])
        return cls(**kwargs)


__all__ = ["MAX_SPECULATIVE_TOKENS", "SpeculativeConfig", "TreeConfig", "positive"]
