"""Engine configuration: one frozen dataclass per concern, validated at construction.

No I/O here and nothing is ever mutated after creation. Derived decisions (the resolved async mode, the
number of KV blocks once the model's size is known) live in separate objects that keep the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from tandem.quantization import ACTIVATION_CHOICES, QUANTIZATION_CHOICES
from tandem import vllm_args
from tandem.speculative_config import SpeculativeConfig
from tandem.speculative_config import positive as _positive

DEFAULT_MODEL = "smollm2-135m-instruct"
_DTYPES = ("auto", "float32", "bfloat16", "float16")
_RUNNERS = ("auto", "generate", "pooling")


def flag(default: Any, help: str, *, choices: tuple[str, ...] | None = None, aliases: tuple[str, ...] = (),
         cli: bool = True) -> Any:
    """A config field that is an engine flag: an ``LLM`` / ``AsyncLLM`` keyword of the field's name and a CLI
    option ``--field-name`` (plus ``aliases``) on every command that builds an engine, the server included
    (:func:`engine_flags`). ``cli`` False: a keyword only (a command spells it its own way)."""
    return field(default=default, metadata={"help": help, "choices": choices, "aliases": aliases, "cli": cli})


@dataclass(frozen=True)
class ModelConfig:
    # (the LLM's first argument, and --model)
    model: str = field(default=DEFAULT_MODEL, metadata={"help": "model name, .gguf file or HF directory"})
    dtype: str = flag("auto", "auto = float32 on CPU, bfloat16 on CUDA", choices=_DTYPES)
    max_model_len: int | None = flag(None, "the longest prompt + output; default the model's context length")
    seed: int = flag(0, "the seed of every request without its own")
    device: str = flag("cpu", "cpu or cuda[:N]")
    # vLLM's name; the decision and its reason: tandem.quantization.
    quantization: str | None = flag(
        None,
        "gguf: a quantized GGUF file's matrices stay in their blocks; int8: weight-only int8 (any checkpoint, a "
        "scale per output feature); none: dequantize at load; default auto (gguf for a quantized GGUF file on "
        "one CPU rank in float32)",
        choices=QUANTIZATION_CHOICES[1:], aliases=("-q",),
    )
    quant_activations: str | None = flag(
        None,
        "what gguf products quantize their inputs to: int8x2 (two int8 levels, ~5e-6 relative), int8 (one, "
        "llama.cpp's, lossy) or float32; default auto (int8x2 with AVX-512 VNNI or AVX2, else float32)",
        choices=ACTIVATION_CHOICES[1:],
    )
    # vLLM's --chat-template
    chat_template: str | None = flag(
        None, "a Jinja chat template (a file's path, or the template itself) in place of the model's"
    )
    # vLLM's; None: the model's own
    tokenizer: str | None = flag(None, "the tokenizer: a .gguf file, a directory with tokenizer.json or a model "
                                       "name; default the model's own")
    # vLLM's --runner: pooling = embeddings (/v1/embeddings, LLM.embed) from the same model's final hidden states
    runner: str = flag("auto", "auto / generate: text generation; pooling: embeddings", choices=_RUNNERS)
    pooler_config: dict[str, Any] | None = flag(
        None, 'JSON: {"pooling_type": "LAST" | "MEAN", "normalize": true} (the default: LAST, normalized)'
    )
    max_logprobs: int = flag(20, "the most logprobs / prompt_logprobs a request may ask for; -1: the vocabulary")
    # vLLM's: where requests' default sampling parameters come from (engine/generation_defaults.py)
    generation_config: str = flag(
        "auto", "auto: the checkpoint's generation_config.json; vllm: vLLM's defaults; or a folder holding one"
    )
    override_generation_config: dict[str, Any] | None = flag(
        None, "JSON: default sampling parameters over the generation config's (e.g. {\"temperature\": 0.5})"
    )

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a non-empty string")
        if self.quantization not in QUANTIZATION_CHOICES:
            raise ValueError(
                f"quantization must be one of {QUANTIZATION_CHOICES[1:]} or None, got {self.quantization!r}"
            )
        if self.quant_activations not in ACTIVATION_CHOICES:
            raise ValueError(
                f"quant_activations must be one of {ACTIVATION_CHOICES[1:]} or None, got {self.quant_activations!r}"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.runner not in _RUNNERS:
            raise ValueError(f"runner must be one of {_RUNNERS}, got {self.runner!r}")
        if self.pooler_config is not None:
            if self.runner != "pooling":
                raise ValueError("pooler_config applies to runner 'pooling'")
            pooler = self.pooler_config
            unknown = sorted(set(pooler) - {"pooling_type", "normalize"}) if isinstance(pooler, dict) else None
            if unknown is None or unknown:
                raise ValueError(f"pooler_config takes pooling_type and normalize, got {pooler!r}")
            if str(pooler.get("pooling_type", "LAST")).upper() not in ("LAST", "MEAN"):
                raise ValueError(f"pooler_config.pooling_type must be LAST or MEAN, got {pooler['pooling_type']!r}")
            if not isinstance(pooler.get("normalize", True), bool):
                raise ValueError(f"pooler_config.normalize must be a bool, got {pooler['normalize']!r}")
        if self.tokenizer is not None and (not isinstance(self.tokenizer, str) or not self.tokenizer):
            raise ValueError(f"tokenizer must be a non-empty string, got {self.tokenizer!r}")
        if self.chat_template is not None and (not isinstance(self.chat_template, str) or not self.chat_template):
            raise ValueError(f"chat_template must be a non-empty string, got {self.chat_template!r}")
        _positive("max_model_len", self.max_model_len, allow_none=True)
        if isinstance(self.max_logprobs, bool) or not isinstance(self.max_logprobs, int) or self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be -1 or a non-negative integer, got {self.max_logprobs!r}")
        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise ValueError(f"generation_config must be 'auto', 'vllm' or a folder, got {self.generation_config!r}")
        if self.override_generation_config is not None and not isinstance(self.override_generation_config, dict):
            raise ValueError("override_generation_config must be a dict of sampling parameters, got "
                             f"{self.override_generation_config!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")

    @property
    def pooling(self) -> bool:
        return self.runner == "pooling"

    @property
    def pooling_type(self) -> str:
        return str((self.pooler_config or {}).get("pooling_type", "LAST")).upper()

    @property
    def pooling_normalize(self) -> bool:
        return bool((self.pooler_config or {}).get("normalize", True))

    @property
    def tokenizer_source(self) -> str:
        return self.tokenizer or self.model

    def resolved_dtype(self) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "float32" if self.device == "cpu" else "bfloat16"


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = flag(16, "tokens per KV block")
    num_kv_blocks: int | None = flag(None, "KV blocks in the pool; wins over --kv-cache-memory")
    kv_cache_memory: int | None = flag(None, "KV cache budget in bytes (target and drafter); default 1 GiB")
    enable_prefix_caching: bool = flag(True, "reuse the KV blocks of earlier requests' equal prefixes")
    # vLLM's; on a CPU its CPU backend's meaning (engine/memory.py)
    gpu_memory_utilization: float | None = flag(
        None, "the fraction of the machine's memory the engine may hold (weights + KV); the KV cache gets the rest "
        "after the weights and the process; used when neither --kv-cache-memory nor --num-kv-blocks is given"
    )

    DEFAULT_KV_CACHE_MEMORY = 1 << 30

    def __post_init__(self) -> None:
        _positive("block_size", self.block_size)
        _positive("num_kv_blocks", self.num_kv_blocks, allow_none=True)
        _positive("kv_cache_memory", self.kv_cache_memory, allow_none=True)
        u = self.gpu_memory_utilization
        if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {u!r}")

    def num_blocks_for(self, bytes_per_block: int, utilization_budget: int | None = None) -> int:
        """KV blocks: ``num_kv_blocks``, else ``kv_cache_memory`` (default 1 GiB), else — when
        ``gpu_memory_utilization`` is given — ``utilization_budget`` (its bytes, from engine/memory.py)."""
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        name = "kv_cache_memory"
        budget = self.kv_cache_memory or self.DEFAULT_KV_CACHE_MEMORY
        if self.kv_cache_memory is None and utilization_budget is not None:
            name, budget = "the KV budget of gpu_memory_utilization", utilization_budget
        blocks = budget // bytes_per_block
        if blocks < 1:
            raise ValueError(
                f"{name} ({budget} bytes) is smaller than one KV block ({bytes_per_block} bytes)"
            )
        return int(blocks)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = flag(64, "requests running at once")
    max_num_batched_tokens: int | None = flag(
        None, "tokens in one step (prefill chunks included); default 2048, or max_model_len (at least 2048) "
        "with chunked prefill off (EnginePlan.max_num_batched_tokens)"
    )
    # Tri-state request: False = off, True = demanded (fail if unsupported), None = decide by capability.
    # Never rewritten: the decision lives in AsyncSchedulingDecision.
    async_scheduling: bool | None = flag(None, "on / off; default: auto (on when every component supports it)")
    # Arm C: the worker launches step N+1 from device-corrected inputs without waiting for step N's
    # accepted counts; the host reconciles later. Needs async scheduling; outputs are identical.
    deferred_reconciliation: bool = flag(
        False, "launch step N+1 without waiting for step N's accepted counts (needs async)"
    )
    # vLLM's; off: a prompt is prefilled in one step or waits (max_num_batched_tokens >= max_model_len)
    enable_chunked_prefill: bool | None = flag(None, "split long prompts over steps; default on")

    def __post_init__(self) -> None:
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens, allow_none=True)
        if self.enable_chunked_prefill not in (None, True, False):
            raise ValueError(f"enable_chunked_prefill must be True, False or None, got {self.enable_chunked_prefill!r}")
        if self.async_scheduling not in (None, True, False):
            raise ValueError(
                f"async_scheduling must be True, False or None, got {self.async_scheduling!r}"
            )


@dataclass(frozen=True)
class ParallelConfig:
    executor_backend: str = flag(
        "uni", "uni (worker thread) | mp (worker processes) | ray (Ray actors)",
        aliases=("--distributed-executor-backend",),
    )
    tensor_parallel_size: int = flag(1, "ranks a model is split over", aliases=("-tp",))
    pipeline_parallel_size: int = flag(1, "vLLM's flag; tandem has no pipeline parallelism: 1 only")
    worker_threads: int | None = flag(
        None, "torch threads per worker; mp default all cores but one (left to the engine process), shared by the "
        "tensor-parallel ranks; ray default 1"
    )
    ray_address: str | None = flag(
        None, "ray executor: address of an existing cluster; default $RAY_ADDRESS, else a local one on 127.0.0.1"
    )

    def __post_init__(self) -> None:
        if not isinstance(self.executor_backend, str) or not self.executor_backend:
            raise ValueError("executor_backend must be a non-empty string")
        _positive("tensor_parallel_size", self.tensor_parallel_size)
        if self.pipeline_parallel_size != 1:
            raise ValueError(
                f"pipeline_parallel_size must be 1 (tandem has no pipeline parallelism; use tensor_parallel_size), "
                f"got {self.pipeline_parallel_size!r}"
            )
        _positive("worker_threads", self.worker_threads, allow_none=True)
        if self.ray_address is not None and not (isinstance(self.ray_address, str) and self.ray_address):
            raise ValueError(f"ray_address must be a non-empty string or None, got {self.ray_address!r}")


@dataclass(frozen=True)
class ObservabilityConfig:
    debug_invariants: bool = flag(False, "check every request and block-pool invariant after every step")
    trace_file: str | None = flag(None, "write a Chrome trace of the run here", cli=False)  # commands: --trace
    # vLLM's; default: on for the server, off for LLM (vLLM's defaults) — engine/stats_logger.py
    disable_log_stats: bool | None = flag(None, "no periodic line of throughput and cache use in the log")
    log_level: str | None = flag(None, "the level of tandem's loggers (DEBUG, INFO, ...)", cli=False)  # CLI: top level

    def __post_init__(self) -> None:
        if self.log_level is not None and str(self.log_level).upper() not in (
            "CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET"
        ):
            raise ValueError(f"log_level must be a logging level name, got {self.log_level!r}")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculative: SpeculativeConfig | None = None
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    # vLLM engine arguments taken with nothing to do here (tandem.vllm_args: "accepted"): (name, repr(value))
    vllm_accepted: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EngineFlag:
    """One engine flag, declared once as a config field (:func:`flag`)."""

    name: str  # the LLM keyword; the CLI option is --name-with-dashes
    section: str  # the EngineConfig field that holds it
    default: Any
    kind: str  # "int", "float", "str", "bool" (on / off) or "json" (speculative_config, dicts)
    help: str
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()
    cli: bool = True


# vLLM's spellings accepted beside the flag they name.
FLAG_ALIASES = {"distributed_executor_backend": "executor_backend"}


def engine_flags() -> tuple[EngineFlag, ...]:
    """Every engine flag, from the config dataclasses' fields (and ``speculative_config``)."""
    out = []
    for section in fields(EngineConfig):
        if section.name == "speculative":
            out.append(EngineFlag("speculative_config", "speculative", None, "json", "JSON, vLLM's keys"))
            continue
        if section.name == "vllm_accepted":
            continue
        for f in fields(section.default_factory()):  # type: ignore[misc]
            if "cli" not in f.metadata:
                continue
            t = str(f.type)
            kind = next((k for k in ("bool", "int", "float", "dict") if t.startswith(k)), "str")
            kind = "json" if kind == "dict" else kind
            out.append(EngineFlag(f.name, section.name, f.default, kind, f.metadata["help"],
                                  f.metadata["choices"], f.metadata["aliases"], f.metadata["cli"]))
    return tuple(out)


def engine_config(model: str = DEFAULT_MODEL, **kw: Any) -> EngineConfig:
    """Engine flags (vLLM names, :func:`engine_flags`) to an ``EngineConfig``: a flag left out or ``None``
    takes its default; an unknown name is a ``ValueError``."""
    for alias, name in FLAG_ALIASES.items():
        if alias in kw:
            value = kw.pop(alias)
            if value is not None and kw.get(name) is not None and kw[name] != value:
                raise ValueError(f"{name}={kw[name]!r} and {alias}={value!r} disagree: they are one setting "
                                 "(tandem's name and vLLM's); pass one")
            kw[name] = kw.get(name) if kw.get(name) is not None else value
    flags = {f.name: f for f in engine_flags()}
    kw, accepted = vllm_args.translate(kw, set(flags))
    unknown = sorted(set(kw) - set(flags))
    if unknown:
        raise ValueError(f"unknown engine argument(s) {unknown}")
    given: dict[str, dict[str, Any]] = {"model": {"model": model}}  # section -> its fields given
    for name, value in kw.items():
        if value is not None and name != "speculative_config":
            given.setdefault(flags[name].section, {})[name] = value
    for name in ("override_generation_config", "pooler_config"):  # JSON on the command line
        if isinstance(given.get("model", {}).get(name), str):
            given["model"][name] = _json_arg(name, given["model"][name])
    sections = {s.name: s.default_factory(**given.get(s.name, {}))  # type: ignore[misc]
                for s in fields(EngineConfig) if s.name not in ("speculative", "vllm_accepted")}
    spec = kw.get("speculative_config")
    if isinstance(spec, str):
        spec = _json_arg("speculative_config", spec)
    if isinstance(spec, dict):  # vLLM's keys beside tandem's own: answered (tandem.vllm_args)
        spec, spec_accepted = vllm_args.translate_speculative(spec, set(SpeculativeConfig.__dataclass_fields__))
        accepted += spec_accepted
    return EngineConfig(**sections, speculative=SpeculativeConfig.from_any(spec), vllm_accepted=accepted)


def _json_arg(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc}") from exc
