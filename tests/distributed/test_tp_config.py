"""``tandem config`` shows the async decision and tensor parallelism for every executor, without
loading weights; unsupported combinations fail before any worker starts, saying why."""

from __future__ import annotations

import json

import pytest

from tandem.engine.builder import plan_engine
from tandem.engine.llm import config_from_kwargs
from tandem.entrypoints.cli import main as cli_main
from tandem.executor import get_executor_class


@pytest.mark.parametrize("backend,tp", [("uni", 1), ("mp", 1), ("mp", 2), ("ray", 2)])
def test_config_shows_async_decision(backend: str, tp: int, capsys) -> None:
    argv = ["config", "--json", "--executor-backend", backend, "--tensor-parallel-size", str(tp)]
    assert cli_main(argv) in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert doc["executor_backend"] == backend and doc["tensor_parallel_size"] == tp
    assert doc["async_scheduling"] == {
        "requested": None, "resolved": True, "reason": "compatible_default", "detail": ""
    }
    assert get_executor_class(backend).SUPPORTS_ASYNC_SCHEDULING  # the matrix lives in the classes


@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_async_speculation_decision_under_tp(backend: str) -> None:
    cfg = config_from_kwargs(
        executor_backend=backend, tensor_parallel_size=2,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    )
    assert plan_engine(cfg, log=False).decision.resolved is True


def test_tp_needs_a_multi_worker_executor() -> None:
    with pytest.raises(ValueError, match="executor_backend 'uni' runs one; use 'mp' or 'ray'"):
        plan_engine(config_from_kwargs(tensor_parallel_size=2), log=False)


def test_tp_that_cannot_split_the_heads_says_why() -> None:
    cfg = config_from_kwargs(executor_backend="mp", tensor_parallel_size=4)
    with pytest.raises(ValueError, match="cannot share 3 KV heads"):
        plan_engine(cfg, log=False)


def test_kv_budget_is_per_rank() -> None:
    one = plan_engine(config_from_kwargs(num_kv_blocks=None), log=False)
    two = plan_engine(config_from_kwargs(executor_backend="mp", tensor_parallel_size=2), log=False)
    # rank 0 holds 2 of the 3 KV heads: the same byte budget holds 3/2 as many blocks
    assert two.bytes_per_block * 3 == one.bytes_per_block * 2


@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle", "eagle3", "mtp"])
def test_every_proposer_runs_under_tp(method: str) -> None:
    from tandem.spec_decode.factory import get_proposer_class

    assert get_proposer_class(method).SUPPORTS_TENSOR_PARALLEL  # drafts replicated on every rank
    cfg = config_from_kwargs(
        executor_backend="mp", tensor_parallel_size=2,
        speculative_config={"method": method, "num_speculative_tokens": 2},
    )
    assert plan_engine(cfg, log=False).decision.resolved is True


def test_a_proposer_without_tp_is_refused_before_any_worker_starts(monkeypatch) -> None:
    from tandem.spec_decode.factory import get_proposer_class

    monkeypatch.setattr(get_proposer_class("eagle"), "SUPPORTS_TENSOR_PARALLEL", False)
    cfg = config_from_kwargs(
        executor_backend="mp", tensor_parallel_size=2,
        speculative_config={"method": "eagle", "num_speculative_tokens": 2},
    )
    with pytest.raises(ValueError, match="method 'eagle' does not support tensor_parallel_size=2"):
        plan_engine(cfg, log=False)
