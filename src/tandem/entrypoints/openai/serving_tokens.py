"""vLLM's ``/tokenize`` and ``/detokenize``: the server's own tokenizer and chat template, so a client can
count tokens, check a prompt against ``max_model_len`` and see what a chat request really sends."""

from __future__ import annotations

from typing import Any

from tandem.entrypoints.openai.errors import APIError
from tandem.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from tandem.entrypoints.openai.serving_chat import render_messages
from tandem.entrypoints.openai.serving_common import ServerContext


def tokenize(ctx: ServerContext, req: TokenizeRequest) -> dict[str, Any]:
    """``{"count", "max_model_len", "tokens", "token_strs"}``: the ids of ``prompt`` (with the special tokens
    unless ``add_special_tokens`` is false), or of ``messages`` rendered by the chat template (which holds
    its own special tokens)."""
    ctx.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError("give exactly one of 'prompt' and 'messages'", 400, "prompt" if req.prompt else "messages")
    tok = ctx.engine.tokenizer
    if req.messages is not None:
        if not req.messages:
            raise APIError("messages must not be empty", 400, "messages")
        text = render_messages(ctx, req.messages, req.add_generation_prompt, req.chat_template_kwargs)
        ids = tok.encode(text, add_special_tokens=False)
    else:
        ids = tok.encode(req.prompt or "", add_special_tokens=req.add_special_tokens)
    return {"count": len(ids), "max_model_len": ctx.engine.max_model_len, "tokens": ids, "token_strs": None}


def detokenize(ctx: ServerContext, req: DetokenizeRequest) -> dict[str, Any]:
    """``{"prompt"}``: the text of ``tokens`` (special tokens kept, as vLLM does)."""
    ctx.check_model(req.model)
    vocab = ctx.engine.tokenizer.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", 400, "tokens")
    return {"prompt": ctx.engine.tokenizer.decode(req.tokens, skip_special_tokens=False)}
