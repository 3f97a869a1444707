"""A sharded model (ranks as threads) computes what the unsharded one computes: the same logits up to
float summation order, identical on every rank, through a paged KV cache over two steps."""

from __future__ import annotations

import pytest
import torch

from tandem.distributed.communicator import Communicator
from tandem.model import CausalLM, KVCache
from tests.distributed.thread_comm import run_ranks
from tests.distributed.tiny import CONFIGS, random_tensors, scenario_batches, tiny_args


def _run(name: str, comm: Communicator | None, block_size: int = 4) -> list[torch.Tensor]:
    overrides, o_bias = CONFIGS[name]
    args = tiny_args(**overrides)
    tensors = random_tensors(args, o_bias=o_bias)
    kw = {} if comm is None else {"comm": comm}
    model = CausalLM.from_tensors(args, tensors, torch.float32, "cpu", **kw)
    batches, num_blocks = scenario_batches(args, block_size)
    cache = KVCache.allocate(
        args.num_hidden_layers, num_blocks, block_size, model.shard.num_kv_heads, args.head_dim,
        torch.float32, "cpu",
    )
    logits = []
    for batch in batches:
        out = model(batch, cache)
        logits.append(model.compute_logits(out.hidden_states))
    return logits


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sharded_logits_match_unsharded(name: str, world: int) -> None:
    if name == "llama-replicated-kv" and world == 3:
        world = 4  # 4 query heads on 1 KV head: 2 or 4 ranks
    ref = _run(name, None)
    per_rank = run_ranks(world, lambda rank, comm: _run(name, comm))
    for step, want in enumerate(ref):
        for rank, got in enumerate(per_rank):
            assert got[step].shape == want.shape
            diff = (got[step] - want).abs().max().item()
            assert diff < 1e-4, f"{name} world {world} rank {rank} step {step}: logits differ by {diff}"
            # all-gathered logits are bitwise identical on every rank: every rank samples the same
            assert torch.equal(got[step], per_rank[0][step])


def test_rank_holds_only_its_slices() -> None:
    args = tiny_args()
    tensors = random_tensors(args)

    def build(rank: int, comm: Communicator) -> CausalLM:
        return CausalLM.from_tensors(args, tensors, torch.float32, "cpu", comm=comm)

    r0, r1 = run_ranks(2, build)
    hd = args.head_dim
    # rank 0: 2 KV groups (4 query heads), rank 1: 1 group (2 query heads); q + k + v rows
    assert r0.layers[0].qkv.shape[0] == (4 + 2 + 2) * hd and r1.layers[0].qkv.shape[0] == (2 + 1 + 1) * hd
    assert r0.layers[0].o_proj.shape == (args.hidden_size, 4 * hd)
    assert r0.layers[0].down.shape[1] + r1.layers[0].down.shape[1] == args.intermediate_size
    assert r0.embed_tokens.shape[0] + r1.embed_tokens.shape[0] == args.vocab_size
    assert r1.lm_head is r1.embed_tokens  # tied: the LM head is the rank's embedding slice


def test_kv_cache_shape_is_checked_per_rank() -> None:
    args = tiny_args()
    tensors = random_tensors(args)

    def check(rank: int, comm: Communicator) -> str:
        model = CausalLM.from_tensors(args, tensors, torch.float32, "cpu", comm=comm)
        full = KVCache.allocate(args.num_hidden_layers, 4, 4, 3, args.head_dim, torch.float32, "cpu")
        with pytest.raises(ValueError, match="expected") as exc:
            model._check_cache(full)
        return str(exc.value)

    msgs = run_ranks(2, check)
    assert "[blocks, block_size, 2, 16]" in msgs[0] and "[blocks, block_size, 1, 16]" in msgs[1]


@pytest.mark.parametrize("tied", [True, False])
def test_full_vocab_tensors_are_gathered_on_every_rank(tied: bool) -> None:
    """What a replicated drafter (EAGLE / MTP head) shares: the whole embedding and LM head."""
    args = tiny_args(tie_word_embeddings=tied)
    tensors = random_tensors(args)
    want_embed = tensors["model.embed_tokens.weight"]
    want_head = want_embed if tied else tensors["lm_head.weight"]

    def full(rank: int, comm: Communicator) -> tuple[torch.Tensor, torch.Tensor]:
        model = CausalLM.from_tensors(args, tensors, torch.float32, "cpu", comm=comm)
        return model.full_vocab_tensors()

    for embed, head in run_ranks(2, full):
        assert torch.equal(embed, want_embed) and torch.equal(head, want_head)
        assert (head is embed) == tied
