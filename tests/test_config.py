"""Engine flags are declared once, as config fields (``tandem.config.flag``): the ``LLM`` keywords, the CLI
options of every engine command (the server's included) and their defaults all come from that declaration."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from tandem.config import EngineConfig, ModelConfig, engine_config, engine_flags
from tandem.engine.llm import config_from_kwargs
from tandem.entrypoints.engine_args import add_engine_args, engine_kwargs


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    return p.parse_args(list(argv))


def test_every_flag_field_is_a_keyword_and_an_option_with_the_configs_default() -> None:
    flags = {f.name: f for f in engine_flags()}
    declared = {
        f.name for s in fields(EngineConfig) if s.name not in ("speculative", "vllm_accepted")
        for f in fields(s.default_factory()) if "cli" in f.metadata  # type: ignore[misc]
    }
    assert declared | {"speculative_config"} == set(flags)
    # nothing given: the config's defaults, whether built from keywords or from a command line
    assert engine_config("m") == EngineConfig(model=ModelConfig(model="m"))
    assert config_from_kwargs("m", **engine_kwargs(_parse())) == config_from_kwargs("m")
    p = argparse.ArgumentParser()
    add_engine_args(p)
    option_dests = {a.dest for a in p._actions}
    assert {n for n, f in flags.items() if f.cli} <= option_dests


def test_options_reach_the_config_and_aliases_name_one_setting() -> None:
    ns = _parse("--max-num-seqs", "3", "--no-enable-prefix-caching", "--async-scheduling", "-tp", "2",
                "--distributed-executor-backend", "mp", "-q", "none", "--speculative-config",
                '{"method": "ngram", "num_speculative_tokens": 2}')
    c = config_from_kwargs("m", **engine_kwargs(ns))
    assert (c.scheduler.max_num_seqs, c.cache.enable_prefix_caching, c.scheduler.async_scheduling) == (3, False, True)
    assert (c.parallel.tensor_parallel_size, c.parallel.executor_backend, c.model.quantization) == (2, "mp", "none")
    assert c.speculative is not None and c.speculative.num_speculative_tokens == 2
    assert engine_config("m", distributed_executor_backend="ray").parallel.executor_backend == "ray"
    with pytest.raises(ValueError, match="disagree"):
        engine_config("m", executor_backend="mp", distributed_executor_backend="ray")


def test_bad_flags_are_named() -> None:
    with pytest.raises(ValueError, match=r"unknown engine argument\(s\) \['max_seqs'\]"):
        config_from_kwargs("m", max_seqs=4)
    with pytest.raises(ValueError, match="max_num_seqs must be a positive integer, got 0"):
        config_from_kwargs("m", max_num_seqs=0)
    with pytest.raises(SystemExit):
        _parse("--dtype", "float64")
    with pytest.raises(ValueError, match="pipeline_parallel_size must be 1"):
        config_from_kwargs("m", pipeline_parallel_size=2)
    assert config_from_kwargs("m", pipeline_parallel_size=1).parallel.pipeline_parallel_size == 1


def test_serve_help_gives_every_option_a_help_text() -> None:
    from tandem.entrypoints.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    missing = [a.option_strings or a.dest for a in serve._actions if not a.help]
    assert not missing, missing
