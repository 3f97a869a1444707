"""The ``ray`` executor on a local Ray cluster started on 127.0.0.1: TP=2 actors in a placement group
give TP=1's greedy tokens (async on, n-gram speculation, ranks checked in lockstep); a killed actor
fails the live requests within seconds; the cluster listens on loopback only."""

from __future__ import annotations

import importlib.util
import os
import signal
import time

import pytest

from tandem import LLM
from tests.distributed.common import GREEDY, N_PROMPTS, NGRAM, check_against_reference
from tests.helpers import collect_failures, humaneval_prompts, start_requests

if importlib.util.find_spec("ray") is None:
    pytest.skip("the ray executor needs Ray: pip install 'tandem-llm[ray]'", allow_module_level=True)

pytestmark = pytest.mark.slow

# IPv6 listening addresses as /proc/net/tcp6 writes them: loopback, and IPv4-mapped 127.0.0.1.
V6_NAMES = {
    "00000000000000000000000001000000": "::1",
    "0000000000000000FFFF00000100007F": "127.0.0.1",
}


@pytest.fixture(scope="module")
def cluster():
    # Not imported at module level: tandem must start the local cluster before Ray's first import
    # for it to be loopback-only (ray_executor.SINGLE_MACHINE_SWITCH).
    from tandem.executor.ray_executor import import_ray, init_local_cluster

    init_local_cluster(num_cpus=max(2, os.cpu_count() or 1))
    yield import_ray()
    import_ray().shutdown()


def _listening_addresses(pids: set[int]) -> set[str]:
    """Local addresses of the TCP sockets the given processes listen on (from /proc)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    addr_hex = cols[1].split(":")[0]
                    if len(addr_hex) == 8:
                        addr = ".".join(str(int(addr_hex[i : i + 2], 16)) for i in (6, 4, 2, 0))
                    else:
                        addr = V6_NAMES.get(addr_hex, addr_hex)
                    found.add(addr)
    return found


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def test_ray_tp2_matches_tp1(cluster, reference: list) -> None:
    llm = LLM(
        max_num_seqs=N_PROMPTS, executor_backend="ray", tensor_parallel_size=2,
        speculative_config=NGRAM, debug_invariants=True,
    )
    try:
        assert llm.async_scheduling.resolved is True  # the default resolves on for ray
        outs = llm.generate(list(humaneval_prompts(N_PROMPTS)), GREEDY, use_tqdm=False)
        check_against_reference(reference, outs, "ray tp2 async ngram")
        executor = llm.engine.core.executor
        assert executor.lockstep_steps_checked >= GREEDY.max_tokens // 4
        assert llm.spec_decode_stats()["num_drafts"] > 0
        # The local cluster's node is 127.0.0.1, the ranks (all on this node) met through a FileStore,
        # and every process of the cluster (GCS, raylet, agents, workers, the actors) and this one
        # listens on loopback only.
        assert {n["NodeManagerAddress"] for n in cluster.nodes() if n["Alive"]} == {"127.0.0.1"}
        assert executor._store_dir is not None and os.path.isdir(executor._store_dir)
        addrs = _listening_addresses(_descendants(os.getpid()) | {os.getpid()})
        assert addrs and addrs <= {"127.0.0.1", "::1"}, addrs
    finally:
        llm.shutdown()


def test_ray_killed_actor_fails_requests_fast(cluster) -> None:
    llm = LLM(max_num_seqs=4, executor_backend="ray", tensor_parallel_size=2)
    core = llm.engine.core
    start_requests(core, llm.tokenizer)
    os.kill(core.executor.pids[1], signal.SIGKILL)
    failed, elapsed = collect_failures(core, 60)
    assert set(failed) == {f"r{i}" for i in range(4)}
    assert elapsed < 15, elapsed
    assert all("ray worker died (rank 1)" in e for e in failed.values()), failed
    assert core.failed is not None
    t1 = time.monotonic()
    llm.shutdown()
    assert time.monotonic() - t1 < 15


def test_ray_actors_build_the_engines_choice(cluster, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """An override set in the engine process after the cluster started: the actors' environment never saw it,
    and they build what the engine resolved (tandem/execution.py), rank by rank."""
    from tandem.execution import resolve_execution
    from tests.spec_decode.tiny_heads import tiny_target

    monkeypatch.setenv("TANDEM_ATTENTION_BACKEND", "sdpa")
    monkeypatch.setenv("TANDEM_NATIVE_DECODE", "0")
    llm = LLM(model=str(tiny_target(tmp_path)), executor_backend="ray", tensor_parallel_size=2, max_model_len=128)
    try:
        want = resolve_execution("cpu").as_dict()
        assert want["attention_backend"] == "sdpa" and want["native_decode"] is False
        assert llm.engine.core.executor.worker_execution == [want, want]
    finally:
        llm.shutdown()
