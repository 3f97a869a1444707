"""Shared fixtures: the TP=1 greedy reference for the 16 HumanEval prompts (computed once)."""

from __future__ import annotations

import pytest

from tandem import LLM
from tests.distributed.common import GREEDY, N_PROMPTS
from tests.helpers import humaneval_prompts


@pytest.fixture(scope="session")
def reference() -> list:
    """TP=1, sync, with top-2 logprobs (the near-tie rule reads them)."""
    llm = LLM(max_num_seqs=N_PROMPTS, async_scheduling=False)
    outs = llm.generate(
        list(humaneval_prompts(N_PROMPTS)), GREEDY.clone(logprobs=2), use_tqdm=False
    )
    llm.shutdown()
    return [o.outputs[0] for o in outs]
