"""From an ``EngineConfig`` to a running engine: size the KV cache, resolve async, build the pieces.

``plan_engine`` does everything that needs no weights (it reads only the model's metadata), so
``tandem config`` can print the async decision without loading a model; ``build_engine`` adds the
weights, the runner and the executor.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from tandem import overrides
from tandem.async_decision import (
    AsyncCapability,
    AsyncReason,
    AsyncSchedulingDecision,
    resolve_async_scheduling,
)
from tandem.config import EngineConfig
from tandem.core.async_scheduler import AsyncScheduler
from tandem.core.kv_cache_manager import kv_cache_groups, request_capacity
from tandem.core.scheduler import Scheduler
from tandem.core.spec_policy import make_policy
from tandem.engine.core import EngineCore
from tandem.engine.generation_defaults import generation_defaults
from tandem.execution import ExecutionPlan, resolve_execution
from tandem.executor import get_executor_class
from tandem.model.forward_batch import KVCache
from tandem.model.loader import load_tokenizer
from tandem.model.loader.model_info import load_model_args
from tandem.model.loader.tokenizer import Tokenizer
from tandem.model.model_args import ModelArgs
from tandem.model.parallel import ShardPlan
from tandem.quantization import QuantizationDecision, resolve_activations, resolve_quantization
from tandem.spec_decode.factory import get_proposer_class
from tandem.speculative_config import HEAD_METHODS, resolve_draft_weights
from tandem.trace.tracer import NULL_TRACER, Tracer
from tandem.worker.worker import WorkerSpec

logger = logging.getLogger("tandem.engine")


@dataclass(frozen=True)
class EnginePlan:
    config: EngineConfig
    args: ModelArgs
    decision: AsyncSchedulingDecision
    num_kv_blocks: int
    max_model_len: int
    bytes_per_block: int
    quantization: QuantizationDecision = field(
        default_factory=lambda: QuantizationDecision(None, "none", "not_quantized_gguf")
    )
    weight_bytes: int | None = None  # resident weight bytes once loaded (None: not known without loading)
    kernels: dict[str, object] | None = None  # the kernel plan of block-quantized products
    execution: ExecutionPlan | None = None  # what computes a step (tandem/execution.py); None: not resolved
    max_num_batched_tokens: int = 2048  # the step's token budget (SchedulerConfig's, resolved)
    # The most rows a step runs through the native decoder stack (0: it never runs): past it a step takes the
    # torch layers, several times dearer a row; the speculation policy keeps its drafts within it.
    native_decode_rows: int = 0

    def draft_weights(self) -> dict[str, object] | None:
        """A draft head's matrices (``speculative_config.draft_dtype``, resolved by the rule the proposer
        builds by); None without a head."""
        spec = self.config.speculative
        if spec is None or spec.method not in HEAD_METHODS:
            return None
        native = self.execution is not None and self.execution.linear_kernels == "native"
        mixed = self.config.model.resolved_dtype() == "float32" and native
        acts = self.quantization.activations if self.quantization.keep_quantized else None
        resolved = resolve_draft_weights(spec.draft_dtype, mixed, acts)
        out: dict[str, object] = {"requested": spec.draft_dtype or "auto", "resolved": resolved}
        if resolved == "q8_0":
            out["activations"] = acts or "float32"
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.config.model.model,
            "dtype": self.config.model.resolved_dtype(),
            "quantization": self.quantization.as_dict(),
            "weight_bytes": self.weight_bytes,
            "kernels": self.kernels,
            "execution": None if self.execution is None else self.execution.as_dict(),
            "native_decode_rows": self.native_decode_rows,
            "overrides": overrides.active(),
            "device": self.config.model.device,
            "executor_backend": self.config.parallel.executor_backend,
            "tensor_parallel_size": self.config.parallel.tensor_parallel_size,
            "speculative_config": (
                None if self.config.speculative is None else asdict(self.config.speculative)
            ),
            "draft_weights": self.draft_weights(),
            "async_scheduling": self.decision.as_dict(),
            "num_kv_blocks": self.num_kv_blocks,
            "block_size": self.config.cache.block_size,
            "kv_cache_bytes": self.num_kv_blocks * self.bytes_per_block,
            "max_model_len": self.max_model_len,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "runner": "pooling" if self.config.model.pooling else "generate",
            "pooler": ({"pooling_type": self.config.model.pooling_type, "normalize": self.config.model.pooling_normalize}
                       if self.config.model.pooling else None),
            "enable_chunked_prefill": self.config.scheduler.enable_chunked_prefill is not False,
            "vllm_accepted": dict(self.config.vllm_accepted),
        }


def async_capabilities(config: EngineConfig) -> list[AsyncCapability]:
    """Every component's own declaration, in the resolver's check order."""
    caps = [get_executor_class(config.parallel.executor_backend).async_capability()]
    if config.model.pooling:
        caps.append(AsyncCapability("runner", "runner 'pooling'", False, AsyncReason.POOLING_MODEL,
                                    "a pooling model has nothing to overlap: async scheduling stays off"))
    if config.speculative is not None:
        caps.append(get_proposer_class(config.speculative.method).async_capability())
    return caps


def plan_engine(config: EngineConfig, args: ModelArgs | None = None, log: bool = True) -> EnginePlan:
    decision = resolve_async_scheduling(
        config.scheduler.async_scheduling, async_capabilities(config), log=log
    )
    args = args or load_model_args(config.model.model)
    from tandem.worker.worker import DTYPES

    if config.model.pooling and config.speculative is not None:
        raise ValueError("runner 'pooling' computes each prompt once and generates nothing: speculative_config "
                         "does not apply")
    tp = config.parallel.tensor_parallel_size
    if tp > 1 and not get_executor_class(config.parallel.executor_backend).SUPPORTS_TENSOR_PARALLEL:
        raise ValueError(
            f"tensor_parallel_size={tp} needs one worker process per rank: executor_backend "
            f"{config.parallel.executor_backend!r} runs one; use 'mp' or 'ray'"
        )
    if tp > 1 and config.speculative is not None:
        proposer_cls = get_proposer_class(config.speculative.method)
        if not proposer_cls.SUPPORTS_TENSOR_PARALLEL:
            raise ValueError(
                f"speculative method {config.speculative.method!r} does not support "
                f"tensor_parallel_size={tp} yet; use 'ngram' or 'draft_model', or "
                "tensor_parallel_size=1"
            )
    # Every rank's slices (raises naming a dimension that cannot be split); the KV cache budget is
    # per rank and rank 0 holds the most KV heads.
    shard = ShardPlan.all_ranks(args, tp)[0]
    # A block is a page of every layer position of one KV cache group (core/kv_cache_manager.py).
    groups = kv_cache_groups(args.layer_windows, args.num_hidden_layers)
    bpb = KVCache.bytes_per_block(
        max(len(layers) for _, layers in groups),
        config.cache.block_size,
        shard.num_kv_heads,
        args.head_dim,
        DTYPES[config.model.resolved_dtype()],
    )
    if config.speculative is not None:
        # A drafter's own cache pages by the target's block ids: the same budget pays for it.
        from tandem.model.loader.registry import resolve_model

        bpb += get_proposer_class(config.speculative.method).kv_bytes_per_block(
            config.speculative, resolve_model(config.model.model), args, config.cache.block_size,
            DTYPES[config.model.resolved_dtype()],
        )
    quant, weight_bytes, kernels, types = _plan_weights(config)
    if quant.int8_weights:
        weight_bytes = int8_weight_bytes(args)
    utilization_budget = None
    if config.cache.gpu_memory_utilization is not None and config.cache.kv_cache_memory is None:
        from tandem.engine.memory import utilization_kv_budget

        utilization_budget = utilization_kv_budget(config.cache.gpu_memory_utilization, weight_bytes or 0,
                                                   config.model.device)
    num_blocks = config.cache.num_blocks_for(bpb, utilization_budget)
    k = config.speculative.num_speculative_tokens if config.speculative else 0
    capacity = request_capacity(num_blocks, config.cache.block_size, tuple(w for w, _ in groups), k + 1)
    model_len = args.max_position_embeddings
    if config.model.max_model_len is not None:
        if config.model.max_model_len > model_len:
            raise ValueError(
                f"max_model_len ({config.model.max_model_len}) exceeds the model's context length "
                f"({model_len})"
            )
        if config.model.max_model_len > capacity:
            raise ValueError(
                f"max_model_len ({config.model.max_model_len}) is larger than the KV cache can hold "
                f"({num_blocks} blocks of {config.cache.block_size} tokens hold one request of {capacity} "
                "tokens at most); raise "
                "kv_cache_memory / num_kv_blocks or lower max_model_len"
            )
        max_model_len = config.model.max_model_len
    else:
        max_model_len = min(model_len, capacity)
    execution = resolve_execution(config.model.device)
    return EnginePlan(
        config, args, decision, num_blocks, max_model_len, bpb, quant, weight_bytes, kernels, execution,
        step_token_budget(config, max_model_len), _native_decode_rows(config, execution, quant, types),
    )


def _native_decode_rows(config: EngineConfig, execution: ExecutionPlan, quant: QuantizationDecision,
                        types: list[str] | None) -> int:
    """Up to how many rows the workers' native decoder stack will take a step (NativeDecode.max_rows, from
    the file's index): 0 where it never runs (off, not the CPU, tensor parallel, a dtype it lacks)."""
    if not execution.native_decode or config.parallel.tensor_parallel_size != 1:
        return 0
    if config.model.resolved_dtype() not in ("float32", "bfloat16"):
        return 0
    from tandem.model.native_decode import planned_rows

    return planned_rows(types if quant.keep_quantized else None, quant.activations)


def step_token_budget(config: EngineConfig, max_model_len: int) -> int:
    """``max_num_batched_tokens`` resolved (vLLM's rule): 2048 by default; with chunked prefill off a whole
    prompt must fit in one step, so the default is ``max(2048, max_model_len)`` and a smaller explicit budget is
    a ``ValueError``."""
    given = config.scheduler.max_num_batched_tokens
    if config.scheduler.enable_chunked_prefill is not False:
        return given or 2048
    if given is None:
        return max(2048, max_model_len)
    if given < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens ({given}) is smaller than max_model_len ({max_model_len}) with "
            "enable_chunked_prefill=False: a prompt could never be prefilled in one step; raise "
            "max_num_batched_tokens, lower max_model_len, or enable chunked prefill"
        )
    return given


def int8_weight_bytes(args: ModelArgs) -> int:
    """Resident weight bytes under ``quantization="int8"`` (weights.py): each layer matrix one byte a weight
    and a float32 scale per output feature; embedding, LM head (untied), norms and biases float32."""
    h, hd, heads, kv, inter = args.hidden_size, args.head_dim, args.num_attention_heads, args.num_key_value_heads, args.intermediate_size
    width = (heads + 2 * kv) * hd
    per_layer = (width * h + width * 4) + (h * heads * hd + h * 4) + (2 * inter * h + 2 * inter * 4) + (h * inter + h * 4)
    per_layer += 4 * ((width if args.attention_bias else 0) + ((heads + kv) * hd if args.qk_norm else 0))
    embed = args.vocab_size * h * 4 * (1 if args.tie_word_embeddings else 2)
    return args.num_hidden_layers * per_layer + embed + h * 4


def _plan_weights(
    config: EngineConfig,
) -> tuple[QuantizationDecision, int | None, dict[str, object] | None, list[str] | None]:
    """The quantization decision, the resident weight bytes, the block-quantized kernel plan and the block
    types kept, from the model file's tensor index alone (no weights read)."""
    from tandem.model.loader.gguf import gguf_weight_plan, is_quantized_file, unkernelled_types
    from tandem.model.loader.gguf_file import GGUFFile
    from tandem.model.loader.registry import resolve_model

    m = config.model
    path = resolve_model(m.model)
    gf = None if path.is_dir() else GGUFFile.open(path)
    decision = resolve_quantization(
        m.quantization, quantized_gguf=gf is not None and is_quantized_file(gf), dtype=m.resolved_dtype(),
        device=m.device, tensor_parallel_size=config.parallel.tensor_parallel_size,
        unkernelled=unkernelled_types(gf) if gf is not None else (),
    )
    int8_path = None
    if decision.keep_quantized:
        from tandem.native.quant_linear import quant_linear_kernel

        kernel = quant_linear_kernel()
        int8_path = kernel.int8_path if kernel is not None else None
    decision = resolve_activations(decision, m.quant_activations, int8_path)
    if gf is None:
        return decision, None, None, None
    from tandem.worker.worker import DTYPES

    elem = DTYPES[m.resolved_dtype()].itemsize
    weight_bytes, types = gguf_weight_plan(gf, decision.keep_quantized, elem)
    kernels = None
    if decision.keep_quantized:
        from tandem.model.block_quant_linear import block_quant_plan

        kernels = block_quant_plan(types, decision.activations)
    return decision, weight_bytes, kernels, types


@dataclass
class Engine:
    plan: EnginePlan
    core: EngineCore
    tokenizer: Tokenizer
    tracer: Tracer
    checkpoint_sha256: str | None = None
    # Requests' default sampling keywords (generation_config, override_generation_config)
    generation_defaults: dict[str, Any] = field(default_factory=dict)


def build_engine(config: EngineConfig, tracer: Tracer = NULL_TRACER) -> Engine:
    backend = config.parallel.executor_backend
    executor_cls = get_executor_class(backend)  # unknown name: ValueError before any loading
    if config.speculative is not None:
        get_proposer_class(config.speculative.method)
    # Weights are loaded where the runner lives (worker thread or process), never on the engine's
    # thread: torch's OpenMP team belongs to the thread that first runs a parallel op, and a second
    # team on the same cores made the forward 20-40 % slower here.
    defaults = generation_defaults(config.model)  # a bad folder or override fails before any loading
    if config.observability.log_level is not None:
        logging.getLogger("tandem").setLevel(config.observability.log_level.upper())
    tokenizer = load_tokenizer(config.model.tokenizer_source)
    if config.model.chat_template is not None:  # the user's template wins over the model's
        from tandem.model.loader.chat_template import user_chat_template

        tokenizer.chat_template = user_chat_template(config.model.chat_template, "chat_template")
    plan = plan_engine(config)
    if tracer.enabled:
        tracer.metadata.update(execution=plan.execution.as_dict() if plan.execution else None,
                               async_scheduling=plan.decision.as_dict())
    logger.info(plan.decision.log_line())
    logger.info(
        "quantization: requested=%s resolved=%s reason=%s; activations %s (%s); resident weights %s",
        plan.quantization.requested, plan.quantization.resolved, plan.quantization.reason,
        plan.quantization.activations, plan.quantization.activations_reason,
        "unknown" if plan.weight_bytes is None else f"{plan.weight_bytes / 2**20:.1f} MiB",
    )
    if config.scheduler.deferred_reconciliation and not plan.decision.resolved:
        raise ValueError(
            "deferred_reconciliation needs async scheduling, which resolved off "
            f"({plan.decision.reason.value}); enable async scheduling or drop the flag"
        )
    eos = frozenset(plan.args.eos_token_ids) | tokenizer.eos_token_ids
    spec = WorkerSpec(
        config=config,
        async_scheduling=plan.decision.resolved,
        num_kv_blocks=plan.num_kv_blocks,
        max_model_len=plan.max_model_len,
        eos_token_ids=eos,
        trace=tracer.enabled,
        quantized=plan.quantization.keep_quantized,
        quant_activations=plan.quantization.activations,
        int8_weights=plan.quantization.int8_weights,
        execution=plan.execution,
    )
    executor = executor_cls.create(spec, tracer=tracer)
    k = config.speculative.num_speculative_tokens if config.speculative else 0
    lookahead = 0
    if config.speculative is not None and get_proposer_class(config.speculative.method).needs_lookahead_slots:
        lookahead = k
    tree = config.speculative.tree if config.speculative is not None else None
    if tree is not None:  # a verify's nodes, and the head's rows of the next tree, past the counted tokens
        lookahead = max(k, tree.max_nodes, tree.head_rows(k))
    scheduler_cls = AsyncScheduler if plan.decision.resolved else Scheduler
    scheduler = scheduler_cls(
        max_num_seqs=config.scheduler.max_num_seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        enable_chunked_prefill=config.scheduler.enable_chunked_prefill is not False,
        max_model_len=plan.max_model_len,
        num_kv_blocks=plan.num_kv_blocks,
        block_size=config.cache.block_size,
        # A pooling runner needs every prompt position's hidden state (MEAN): nothing is served from the cache.
        enable_prefix_caching=config.cache.enable_prefix_caching and not config.model.pooling,
        num_speculative_tokens=k,
        num_lookahead_tokens=lookahead,
        tree_nodes=tree.max_nodes if tree is not None else 0,
        kv_group_windows=tuple(w for w, _ in kv_cache_groups(plan.args.layer_windows, plan.args.num_hidden_layers)),
        spec_policy=(make_policy(config.speculative.policy, k, config.speculative.method,
                                 tree_nodes=tree.max_nodes if tree is not None else 0,
                                 fast_rows=plan.native_decode_rows)
                     if config.speculative else None),
    )
    core = EngineCore(
        scheduler,
        executor,
        async_scheduling=plan.decision.resolved,
        debug_invariants=config.observability.debug_invariants,
        tracer=tracer,
    )
    if config.observability.disable_log_stats is False:  # None: off (vLLM's LLM); the server turns it on
        from tandem.engine.stats_logger import StatsLogger

        core.stats_logger = StatsLogger()
    return Engine(plan, core, tokenizer, tracer, generation_defaults=defaults)
