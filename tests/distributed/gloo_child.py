"""One rank of a real gloo group (run as ``python -m tests.distributed.gloo_child DIR RANK WORLD``):
checks the collectives, runs the tiny sharded model, saves its logits to ``DIR/rank{RANK}.pt``."""

from __future__ import annotations

import sys

import torch


def main(directory: str, rank: int, world: int) -> None:
    from tandem.distributed.process_group import DistInit, connect, file_init_method
    from tandem.model import CausalLM, KVCache
    from tests.distributed.tiny import CONFIGS, random_tensors, scenario_batches, tiny_args

    torch.set_num_threads(1)
    comm = connect(DistInit(world, file_init_method(directory), timeout_s=60), rank, torch.device("cpu"))
    t = torch.full((3,), float(rank + 1))
    assert comm.all_reduce(t).tolist() == [world * (world + 1) / 2] * 3
    gathered = comm.all_gather(torch.tensor([rank, 10 * rank]))
    assert [g.tolist() for g in gathered] == [[r, 10 * r] for r in range(world)]
    results = {}
    for name, (overrides, o_bias) in CONFIGS.items():
        args = tiny_args(**overrides)
        model = CausalLM.from_tensors(
            args, random_tensors(args, o_bias=o_bias), torch.float32, "cpu", comm=comm
        )
        batches, num_blocks = scenario_batches(args)
        cache = KVCache.allocate(
            args.num_hidden_layers, num_blocks, 4, model.shard.num_kv_heads, args.head_dim,
            torch.float32, "cpu",
        )
        results[name] = [model.compute_logits(model(b, cache).hidden_states) for b in batches]
    assert comm.stats is not None and comm.stats.all_reduce_calls > 0
    torch.save(results, f"{directory}/rank{rank}.pt")
    comm.close()  # leave together: exiting with the group up can abort in gloo's threads


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
