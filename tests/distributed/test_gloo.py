"""Real gloo process groups (two processes, FileStore rendezvous, loopback only): the collectives and
the sharded model give the unsharded model's logits, bitwise identical on both ranks."""

from __future__ import annotations

import subprocess
import sys

import torch

from tandem.model import CausalLM, KVCache
from tests.distributed.tiny import CONFIGS, random_tensors, scenario_batches, tiny_args


def test_two_gloo_ranks_match_one(tmp_path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.distributed.gloo_child", str(tmp_path), str(r), "2"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for name, (overrides, o_bias) in CONFIGS.items():
        args = tiny_args(**overrides)
        model = CausalLM.from_tensors(args, random_tensors(args, o_bias=o_bias))
        batches, num_blocks = scenario_batches(args)
        cache = KVCache.allocate(
            args.num_hidden_layers, num_blocks, 4, args.num_key_value_heads, args.head_dim,
            torch.float32, "cpu",
        )
        for step, batch in enumerate(batches):
            want = model.compute_logits(model(batch, cache).hidden_states)
            got0, got1 = ranks[0][name][step], ranks[1][name][step]
            assert torch.equal(got0, got1), f"{name} step {step}: ranks disagree"
            assert (got0 - want).abs().max().item() < 1e-4, name
