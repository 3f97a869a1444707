"""Request bodies of the OpenAI-compatible API (pydantic, strict: ``"1"`` is not a number,
``true`` is not an integer, NaN and infinities are refused).

These models check shapes and types and keep integers within bounds the engine can hold; the range
rules of each sampling field live in ``SamplingParams`` and its ``ValueError`` becomes a 400 naming
the field. Unknown fields are ignored, as OpenAI and vLLM do. Names follow vLLM's protocol,
including its extensions (``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``,
``stop_token_ids``, ...).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 128  # samples per prompt
MAX_CHOICES = 256  # prompts x n in one request
_I32 = 2**31 - 1

TokenId = Annotated[int, Field(ge=-_I32, le=_I32)]  # the vocabulary check names the real bound
SmallInt = Annotated[int, Field(ge=-_I32, le=_I32)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]


_PASSED = (
    "n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos", "min_tokens",
    "include_stop_str_in_output", "skip_special_tokens", "bad_words",
)  # fmt: skip


_STRUCTURED_KEYS = frozenset({"json", "json_object", "regex", "choice", "grammar"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class JsonSchemaFormat(_Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class ResponseFormat(_Strict):
    """OpenAI's ``response_format``: plain text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Strict):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _SamplingRequest(_Strict):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: SmallInt | None = None
    min_p: float | None = None
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: SmallInt = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logit_bias: dict[str, Bias] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    bad_words: list[str] | None = None
    # Structured outputs: OpenAI's response_format, or vLLM's extra fields (at most one of them).
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def sampling_kwargs(self) -> dict[str, Any]:
        """The set fields as ``SamplingParams`` keyword arguments (unset: SamplingParams' default)."""
        kw = {name: getattr(self, name) for name in _PASSED if getattr(self, name) is not None}
        if self.logit_bias:
            try:
                kw["logit_bias"] = {int(k): v for k, v in self.logit_bias.items()}
            except ValueError as exc:
                raise ValueError("logit_bias keys must be token ids (integers as strings)") from exc
        structured = self.structured_outputs_kwargs()
        if structured is not None:
            kw["structured_outputs"] = structured
        return kw

    def structured_outputs_kwargs(self) -> dict[str, Any] | None:
        """``StructuredOutputsParams`` keyword arguments from whichever field the client used."""
        given: list[tuple[str, dict[str, Any]]] = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            given.append(("response_format", {"json_object": True}))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise ValueError("structured_outputs: response_format json_schema needs a schema")
            given.append(("response_format", {"json": rf.json_schema.schema_}))
        if self.structured_outputs is not None:
            unknown = sorted(set(self.structured_outputs) - _STRUCTURED_KEYS)
            if unknown:
                raise ValueError(f"structured_outputs: unsupported field(s) {unknown}")
            given.append(("structured_outputs", dict(self.structured_outputs)))
        guided = (
            ("guided_json", "json", self.guided_json),
            ("guided_regex", "regex", self.guided_regex),
            ("guided_choice", "choice", self.guided_choice),
            ("guided_grammar", "grammar", self.guided_grammar),
        )
        given += [(name, {key: value}) for name, key, value in guided if value is not None]
        if len(given) > 1:
            names = ", ".join(name for name, _ in given)
            raise ValueError(f"structured_outputs: give at most one constraint, got {names}")
        return given[0][1] if given else None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: SmallInt | None = 16  # OpenAI's and vLLM's default for completions
    logprobs: SmallInt | None = None
    echo: bool = False
    prompt_logprobs: SmallInt | None = None  # vLLM's extra: each prompt position's logprobs, top-n
    suffix: str | None = None
    best_of: SmallInt | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class MediaPart(_Strict):
    """An image / audio / video content part: parsed so it can be refused by name (text-only models)."""

    type: Literal["image_url", "input_image", "image", "input_audio", "audio_url", "video_url", "file"]


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    """An assistant message's earlier call (chat history)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None


class ToolDefinition(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | MediaPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None  # tool: the call this answers

    @property
    def media(self) -> str | None:
        """The type of the first non-text content part, if any."""
        if isinstance(self.content, list):
            return next((part.type for part in self.content if isinstance(part, MediaPart)), None)
        return None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))


class ChatCompletionRequest(_SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: SmallInt | None = None  # None: up to the context length
    max_completion_tokens: SmallInt | None = None
    logprobs: bool = False
    top_logprobs: SmallInt | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class EmbeddingRequest(_Strict):
    """OpenAI's ``/v1/embeddings``: one input or a batch, as text or token ids."""

    model: str | None = None
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: SmallInt | None = None
    user: str | None = None


class TokenizeRequest(_Strict):
    """vLLM's ``/tokenize``: a completion ``prompt`` or chat ``messages`` (rendered by the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[TokenId]
