"""``chat_template`` (vLLM's ``--chat-template`` / ``LLM(chat_template=...)`` / ``LLM.chat(chat_template=...)``):
a file's path or the template itself replaces the model's template; anything else is a ValueError naming the
field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem import LLM, SamplingParams
from tandem.entrypoints.engine_args import add_engine_args, engine_kwargs
from tests.spec_decode.tiny_heads import tiny_target

TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}"
MESSAGES = [{"role": "user", "content": "the cat"}]


def test_engine_and_call_templates_replace_the_models(tmp_path: Path) -> None:
    target = tiny_target(tmp_path)
    llm = LLM(str(target), chat_template=TEMPLATE, max_num_seqs=1, max_model_len=64)
    assert llm.tokenizer.apply_chat_template(MESSAGES) == "[user] the cat\n>"
    path = tmp_path / "other.jinja"
    path.write_text("{% for m in messages %}<{{ m['content'] }}>{% endfor %}")
    out = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False, chat_template=str(path))
    assert out[0].prompt == "<the cat>"
    with pytest.raises(ValueError, match="chat_template: 'no-such.jinja' is neither a file nor a Jinja template"):
        llm.chat(MESSAGES, chat_template="no-such.jinja")
    llm.shutdown()
    with pytest.raises(ValueError, match="chat_template must be a non-empty string"):
        LLM(str(target), chat_template="")


def test_cli_flag_reaches_the_engine_arguments() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    ns = parser.parse_args(["--chat-template", TEMPLATE])
    assert engine_kwargs(ns)["chat_template"] == TEMPLATE
