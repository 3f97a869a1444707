"""The tiny random checkpoint of the structured-output tests, its speculation arms and one generate.

A random model has no idea of any format or of penalties, so every constraint that holds is the
engine's doing, and the runs take seconds. The arms cover every proposer kind: ``ngram`` (device
n-gram), ``draft_model`` with the target as its own draft (host-side drafter, its own KV), ``eagle``
with a random head (device drafter over the target's hidden states), async scheduling off, on and
deferred.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem import LLM, SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3, "policy": "fixed"}
VOCAB = 261
NUM_KV_BLOCKS = 128  # 2048 tokens: plenty, and the block pool is built in milliseconds


def make_tiny(root: Path) -> dict[str, Any]:
    """{"target": checkpoint dir, "eagle": head dir}."""
    from tests.model.test_loader_hf import save_tiny
    from tests.spec_decode.tiny_heads import write_eagle

    target, _ = save_tiny(root, "llama")
    return {"target": target, "eagle": write_eagle(root / "eagle", VOCAB)}


def arms(tiny: dict[str, Any]) -> dict[str, dict[str, Any]]:
    target = str(tiny["target"])
    # The fixed policy: these arms compare drafting statistics across async modes (the adaptive one decides
    # from statistics one step older under async, and may not draft at all for a tiny model).
    self_draft = {"method": "draft_model", "num_speculative_tokens": 3, "model": target, "policy": "fixed"}
    eagle = {"method": "eagle", "num_speculative_tokens": 3, "model": str(tiny["eagle"]), "policy": "fixed"}
    return {
        "nospec-async": {"async_scheduling": True},
        "ngram-sync": {"speculative_config": NGRAM, "async_scheduling": False},
        "ngram-async": {"speculative_config": NGRAM, "async_scheduling": True},
        "ngram-deferred": {
            "speculative_config": NGRAM, "async_scheduling": True, "deferred_reconciliation": True,
        },
        "draft-async": {"speculative_config": self_draft, "async_scheduling": True},
        "eagle-sync": {"speculative_config": eagle, "async_scheduling": False},
        "eagle-async": {"speculative_config": eagle, "async_scheduling": True},
        "eagle-deferred": {
            "speculative_config": eagle, "async_scheduling": True, "deferred_reconciliation": True,
        },
    }


def generate(
    model: Path, prompts: list[str], params: list[SamplingParams], **kw: Any
) -> tuple[list, dict, int]:
    """(completion outputs, spec stats, preemptions); checks the scheduler is clean afterwards."""
    kw.setdefault("num_kv_blocks", NUM_KV_BLOCKS)
    llm = LLM(str(model), max_num_seqs=kw.pop("max_num_seqs", 4), debug_invariants=True, **kw)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        sched = llm.engine.core.scheduler
        assert sched.kv.all_free() and not sched.requests
        stats = llm.spec_decode_stats()
        return [o for o in outs], stats, sched.counters.num_preemptions
    finally:
        llm.shutdown()
