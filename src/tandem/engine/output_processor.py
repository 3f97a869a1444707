"""Front-end bookkeeping per request: detokenization, stop strings, logprobs, timings, outputs.

Stop strings are detected here, on detokenized text, token by token: the token that completes a stop
string is the last one kept, the stop string itself is cut from the text (unless
``include_stop_str_in_output``), and the caller finishes the request in the engine core — any tokens of
steps still in flight for it are then ignored there. For streaming, text that could still turn out to be
the start of a stop string is held back until it cannot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tandem.core.interface import EngineCoreOutput, TokenLogprobs
from tandem.engine.detokenizer import IncrementalDetokenizer
from tandem.model.loader import Tokenizer
from tandem.outputs import (
    CompletionOutput,
    Logprob,
    RequestMetrics,
    SampleLogprobs,
    SpecDecodeRequestStats,
)
from tandem.sampling_params import SamplingParams


@dataclass
class FrontRequest:
    req_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detok: IncrementalDetokenizer
    metrics: RequestMetrics
    index: int = 0
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    streamed_chars: int = 0  # text already handed out by ``take_delta``
    streamed_tokens: int = 0
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    prompt_logprobs_sent: bool = False  # handed out whole, with the first delta after the prefill
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    num_cached_tokens: int = 0
    spec: SpecDecodeRequestStats = field(default_factory=SpecDecodeRequestStats)
    pooled: list[float] | None = None  # pooling runner: the prompt's embedding

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def completion(self) -> CompletionOutput:
        return CompletionOutput(
            index=self.index,
            text=self.text,
            token_ids=list(self.token_ids),
            cumulative_logprob=self.cumulative_logprob,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            spec_decode=self.spec,
        )

    def take_delta(self) -> tuple[str, list[int]]:
        """New text and token ids since the last call, holding back a possible stop-string start."""
        hold = 0
        if not self.finished and self.params.stop:
            hold = max(len(s) for s in self.params.stop) - 1
        upto = max(self.streamed_chars, len(self.text) - hold)
        text = self.text[self.streamed_chars : upto]
        tokens = self.token_ids[self.streamed_tokens :]
        self.streamed_chars = upto
        self.streamed_tokens = len(self.token_ids)
        return text, tokens


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, FrontRequest] = {}

    def add_request(
        self,
        req_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
        index: int = 0,
    ) -> FrontRequest:
        detok = IncrementalDetokenizer(
            self.tokenizer, prompt_token_ids, skip_special_tokens=params.skip_special_tokens
        )
        fr = FrontRequest(
            req_id=req_id,
            prompt=prompt,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            detok=detok,
            metrics=RequestMetrics(arrival_time=arrival_time),
            index=index,
            logprobs=[] if params.logprobs is not None else None,
            cumulative_logprob=0.0 if params.logprobs is not None else None,
            prompt_logprobs=[] if params.prompt_logprobs is not None else None,
        )
        self.requests[req_id] = fr
        return fr

    def pop(self, req_id: str) -> FrontRequest | None:
        return self.requests.pop(req_id, None)

    def process(self, outputs: list[EngineCoreOutput]) -> tuple[list[FrontRequest], list[str]]:
        """Apply one step's outputs. Returns the requests that changed and the ids that a stop string
        finished (the caller must finish those in the engine core)."""
        now = time.monotonic()
        changed: list[FrontRequest] = []
        stopped: list[str] = []
        for out in outputs:
            fr = self.requests.get(out.req_id)
            if fr is None or fr.finish_reason is not None:  # (fr.finished, without a call per output)
                continue
            if out.pooled is not None:
                fr.pooled = out.pooled
            if out.prompt_logprobs and fr.prompt_logprobs is not None:
                fr.prompt_logprobs.extend(self._convert(lp) for lp in out.prompt_logprobs)
            if fr.metrics.first_scheduled_time is None:
                fr.metrics.first_scheduled_time = out.first_scheduled_time
            if out.new_token_ids:
                fr.num_cached_tokens = out.num_cached_tokens
                if fr.metrics.first_token_time is None:
                    fr.metrics.first_token_time = now
                fr.metrics.last_token_time = now
                fr.metrics.token_times.append(now)
                if out.num_draft_tokens:
                    fr.spec.num_verify_steps += 1
                    fr.spec.num_draft_tokens += out.num_draft_tokens
                    fr.spec.num_accepted_tokens += out.num_accepted_tokens
            hit_stop = self._append_tokens(fr, out)
            if hit_stop:
                stopped.append(fr.req_id)
            elif out.finish_reason is not None:
                if fr.params.detokenize:
                    fr.text += fr.detok.finish()  # text held back for an incomplete character
                fr.finish_reason = out.finish_reason
                fr.stop_reason = out.stop_reason
                fr.error = out.error
            if fr.finish_reason is not None:
                fr.metrics.finished_time = now
            fr.metrics.num_generation_tokens = len(fr.token_ids)
            changed.append(fr)
        return changed, stopped

    def _append_tokens(self, fr: FrontRequest, out: EngineCoreOutput) -> bool:
        params = fr.params
        for i, token in enumerate(out.new_token_ids):
            fr.token_ids.append(token)
            if out.new_logprobs is not None and fr.logprobs is not None and i < len(out.new_logprobs):
                lp = out.new_logprobs[i]
                fr.logprobs.append(self._convert(lp) or {})
                fr.cumulative_logprob = (fr.cumulative_logprob or 0.0) + lp.logprob
            if not params.detokenize:
                continue
            delta = fr.detok.add_tokens([token])
            before = len(fr.text)
            fr.text += delta
            if params.stop and self._check_stop_strings(fr, before):
                return True
        return False

    @staticmethod
    def _check_stop_strings(fr: FrontRequest, before: int) -> bool:
        longest = max(len(s) for s in fr.params.stop)
        window_start = max(0, before - longest + 1)
        best: tuple[int, str] | None = None
        for s in fr.params.stop:
            pos = fr.text.find(s, window_start)
            if pos != -1 and (best is None or pos < best[0]):
                best = (pos, s)
        if best is None:
            return False
        pos, s = best
        fr.text = fr.text[: pos + len(s)] if fr.params.include_stop_str_in_output else fr.text[:pos]
        fr.streamed_chars = min(fr.streamed_chars, len(fr.text))
        fr.finish_reason = "stop"
        fr.stop_reason = s
        return True

    def _convert(self, lp: TokenLogprobs | None) -> dict[int, Logprob] | None:
        if lp is None:
            return None
        entries = {lp.token_id: Logprob(lp.logprob, lp.rank, self._decode(lp.token_id))}
        for rank, (tid, val) in enumerate(zip(lp.top_ids, lp.top_logprobs), start=1):
            if tid not in entries:
                entries[tid] = Logprob(val, rank, self._decode(tid))
        return entries

    def _decode(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)
