"""Every vLLM engine argument, answered.

vLLM's ``EngineArgs`` fields (the list in ``vllm_engine_args.json``, read from vLLM's source by
``scripts/vllm_engine_args.py``) each get one answer here, so ``LLM(...)``, the engine commands' flags and the
server take a vLLM user's arguments as they are:

- **flag**: tandem's own engine flag of the same name (``tandem.config``), vLLM's meaning;
- **honoured**: vLLM's meaning, given to a tandem flag of another name or shape (``to``);
- **accepted**: taken with any value and recorded (``EngineConfig.vllm_accepted``, shown by ``tandem config``);
  ``meaning`` says what it means here (most: a GPU tuning knob with nothing to tune on a CPU, or a download
  setting where nothing is downloaded);
- **default_only**: taken at vLLM's default (or ``None`` / ``False`` / empty, or one of ``allowed``) and
  refused otherwise with a ``ValueError`` that names the argument and says why (a feature tandem lacks).

docs/VLLM_ARGS.md lists every argument with its answer (``python -m tandem.vllm_args`` writes the table).
No torch here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable

DATA = Path(__file__).with_name("vllm_engine_args.json")


@dataclass(frozen=True)
class Answer:
    kind: str  # flag | honoured | accepted | default_only
    meaning: str
    to: Callable[[Any], dict[str, Any]] | None = None  # honoured: the value -> tandem keywords
    allowed: tuple[Any, ...] = ()  # default_only: values taken beside vLLM's default


def _flag(meaning: str = "tandem's flag of this name, vLLM's meaning") -> Answer:
    return Answer("flag", meaning)


def _to(meaning: str, fn: Callable[[Any], dict[str, Any]]) -> Answer:
    return Answer("honoured", meaning, fn)


def _accepted(meaning: str) -> Answer:
    return Answer("accepted", meaning)


def _default_only(reason: str, *allowed: Any) -> Answer:
    return Answer("default_only", reason, allowed=allowed)


def _convert(value: Any) -> dict[str, Any]:
    if value in ("auto", "none"):
        return {}
    if value == "embed":
        return {"runner": "pooling"}
    raise ValueError(f"convert={value!r} is not supported: tandem converts a causal LM to 'embed' only "
                     "(vLLM's default 'auto' is accepted)")


def _spec_shorthand(key: str) -> Callable[[Any], dict[str, Any]]:
    return lambda v: {"_spec_" + key: v}


_NO_GPU = "a CUDA graph / GPU kernel setting: tandem captures no graphs and compiles nothing; recorded, no effect"
_NO_DOWNLOAD = "tandem loads local files and installed packages and never downloads; recorded, no effect"
_LOCAL = "tandem loads local files and installed packages: there are no hub revisions"
_MM = "tandem serves text-only models"
_LORA = "tandem has no LoRA adapters"
_DP = "tandem runs one data-parallel rank of a dense model (tensor parallelism: tensor_parallel_size)"
_CP = "tandem has no context parallelism"
_MAMBA = "tandem has no state-space (Mamba) layers"
_OFFLOAD = "tandem keeps weights and KV where they are computed; nothing is offloaded"
_KV_TRANSFER = "tandem has no KV transfer / disaggregated serving"
_SLEEP = "tandem has no sleep mode"
_OBS = "tandem's metrics are the /metrics set and its traces (--trace); this extra one is not produced"
_SCHED = "tandem's scheduler is FCFS with chunked prefill and recompute preemption; this policy knob is not offered"
_MODEL_LOAD = "tandem builds the architectures it implements from the checkpoint as it is"

ANSWERS: dict[str, Answer] = {
    # -- tandem's own flags, vLLM's names ------------------------------------------------------------------
    **{n: _flag() for n in (
        "dtype", "seed", "max_model_len", "distributed_executor_backend", "pipeline_parallel_size",
        "tensor_parallel_size", "block_size", "enable_prefix_caching", "max_num_batched_tokens", "max_num_seqs",
        "quantization", "speculative_config", "async_scheduling", "gpu_memory_utilization", "max_logprobs",
        "enable_chunked_prefill", "disable_log_stats", "generation_config", "override_generation_config",
        "tokenizer", "runner", "pooler_config",
    )},
    "model": _flag("the model: a name tandem knows, a .gguf file or an HF directory"),
    # -- vLLM's meaning under another tandem name ------------------------------------------------------------
    "kv_cache_memory_bytes": _to("the KV cache budget in bytes (tandem: kv_cache_memory)",
                                 lambda v: {"kv_cache_memory": v}),
    "num_gpu_blocks_override": _to("the number of KV blocks (tandem: num_kv_blocks)", lambda v: {"num_kv_blocks": v}),
    "spec_method": _to("speculative_config's method (vLLM's shorthand)", _spec_shorthand("method")),
    "spec_model": _to("speculative_config's model (vLLM's shorthand)", _spec_shorthand("model")),
    "spec_tokens": _to("speculative_config's num_speculative_tokens (vLLM's shorthand)",
                       _spec_shorthand("num_speculative_tokens")),
    "log_level": _flag("the level of tandem's loggers"),
    # -- accepted: nothing to do on this engine, recorded ------------------------------------------------------
    **{n: _accepted(_NO_GPU) for n in (
        "enforce_eager", "compilation_config", "cudagraph_capture_sizes", "max_cudagraph_capture_size",
        "optimization_level", "performance_mode", "ir_op_priority", "kernel_config", "enable_flashinfer_autotune",
        "moe_backend", "linear_backend", "sparse_indexer_topk_backend", "disable_cascade_attn",
        "disable_custom_all_reduce", "enable_shm_tensor_arena", "gdn_prefill_backend", "kda_prefill_backend",
        "kda_decode_backend", "cudagraph_metrics", "enable_layerwise_nvtx_tracing", "attention_config",
    )},
    "attention_backend": _accepted("vLLM's backend names do not apply: tandem resolves its own attention kernel "
                                   "(tandem config: execution; override TANDEM_ATTENTION_BACKEND); recorded"),
    **{n: _accepted(_NO_DOWNLOAD) for n in (
        "download_dir", "hf_token", "safetensors_load_strategy", "safetensors_prefetch_num_threads",
        "safetensors_prefetch_block_size", "use_tqdm_on_load", "max_parallel_loading_workers", "ignore_patterns",
    )},
    "trust_remote_code": _accepted("tandem never runs a checkpoint's code: it builds only architectures it "
                                   "implements, and a model that needs remote code is refused at load"),
    "served_model_name": _accepted("the name(s) tandem serve answers to in 'model'; LLM: recorded"),
    "master_addr": _accepted("tandem's tensor-parallel ranks meet on a loopback port of their own; recorded"),
    "master_port": _accepted("tandem's tensor-parallel ranks meet on a loopback port of their own; recorded"),
    "distributed_timeout_seconds": _accepted("recorded; tandem's ranks use gloo's default timeout"),
    "cpu_distributed_timeout_seconds": _accepted("recorded; tandem's ranks use gloo's default timeout"),
    "prefix_caching_hash_algo": _accepted("tandem keys cached blocks by its own chained hash of the tokens; "
                                          "recorded"),
    "limit_mm_per_prompt": _accepted(_MM + ": a text-only model takes no multimodal items; recorded"),
    "disable_chunked_mm_input": _accepted(_MM + "; recorded"),
    "allowed_local_media_path": _accepted(_MM + "; recorded"),
    "allowed_media_domains": _accepted(_MM + "; recorded"),
    "aggregate_engine_logging": _accepted("tandem runs one engine core; recorded"),
    "show_hidden_metrics_for_version": _accepted("tandem hides no metrics; recorded"),
    "renderer_num_workers": _accepted("prompts are rendered on the front end's thread; recorded"),
    "shutdown_timeout": _accepted("tandem serve: seconds running requests go on after SIGTERM before each ends "
                                  "with an error event (streams) or a 503; LLM: recorded"),
    # -- at vLLM's default only ---------------------------------------------------------------------------
    "revision": _default_only(_LOCAL),
    "code_revision": _default_only(_LOCAL),
    "tokenizer_revision": _default_only(_LOCAL),
    "tokenizer_mode": _default_only("tandem's tokenizers are the `tokenizers` library's (vLLM's 'hf')", "hf"),
    "skip_tokenizer_init": _default_only("tandem detokenizes every output; the tokenizer is always loaded"),
    "load_format": _default_only(_MODEL_LOAD + "; the format is read from the file", "gguf", "safetensors"),
    "config_format": _default_only(_MODEL_LOAD + "; the format is read from the file", "hf", "gguf"),
    "kv_cache_dtype": _default_only("the KV cache has the model's dtype"),
    "kv_cache_dtype_skip_layers": _default_only("the KV cache has the model's dtype"),
    "convert": _to("embed: a causal LM served as an embedding model (runner 'pooling'); auto / none: as it is",
                   lambda v: _convert(v)),
    "model_impl": _default_only(_MODEL_LOAD),
    "hf_config_path": _default_only(_MODEL_LOAD),
    "hf_overrides": _default_only(_MODEL_LOAD),
    "model_class_overrides": _default_only(_MODEL_LOAD),
    "model_weights": _default_only(_MODEL_LOAD),
    "quantization_config": _default_only("quantization is chosen by `quantization` and read from the file"),
    "allow_deprecated_quantization": _default_only("quantization is chosen by `quantization`"),
    "disable_sliding_window": _default_only("sliding-window layers keep their window (it is the model's "
                                            "meaning)"),
    "disable_hybrid_kv_cache_manager": _default_only("a model with windows keeps one KV group per layer kind"),
    "logprobs_mode": _default_only("logprobs are the raw model's (before temperature, penalties or masks)"),
    "use_fp64_gumbel": _default_only("tandem's sampler draws in float32"),
    "enable_trace_replay": _default_only(_OBS),
    "logits_processors": _default_only("custom logits processors are not loaded"),
    "structured_outputs_config": _default_only("structured outputs use xgrammar",
                                               {"backend": "xgrammar"}, {"backend": "auto"}),
    "reasoning_parser": _default_only("tandem has no reasoning parser"),
    "reasoning_parser_plugin": _default_only("tandem has no reasoning parser"),
    "reasoning_config": _default_only("tandem has no reasoning parser"),
    "io_processor_plugin": _default_only("tandem loads no plugins"),
    "worker_cls": _default_only("tandem's workers are its own"),
    "worker_extension_cls": _default_only("tandem's workers are its own"),
    "scheduler_cls": _default_only(_SCHED),
    "scheduling_policy": _default_only(_SCHED),
    "long_prefill_token_threshold": _default_only(_SCHED),
    "long_prefill_token_threshold_adaptive": _default_only(_SCHED),
    "max_num_scheduled_tokens": _default_only(_SCHED + " (the token budget is max_num_batched_tokens)"),
    "max_num_active_seqs": _default_only(_SCHED + " (running requests: max_num_seqs)"),
    "max_num_queued_reqs": _default_only(_SCHED),
    "max_num_queued_tokens": _default_only(_SCHED),
    "prefill_schedule_interval": _default_only(_SCHED),
    "watermark": _default_only(_SCHED),
    "scheduler_reserve_full_isl": _default_only(_SCHED),
    "stream_interval": _default_only("outputs stream after every step"),
    "prefix_cache_retention_interval": _default_only("cached blocks stay until their memory is needed (LRU)"),
    "prefix_match_unit": _default_only("prefixes match in whole KV blocks"),
    "kv_sharing_fast_prefill": _default_only("no layer shares another's KV in the models tandem runs"),
    "swa_bounded_replay": _default_only("tandem recomputes a preempted request in full"),
    "device_ids": _default_only("the device is chosen by `device` (cpu or cuda[:N])"),
    "numa_bind": _default_only("tandem does not bind workers to NUMA nodes"),
    "numa_bind_nodes": _default_only("tandem does not bind workers to NUMA nodes"),
    "numa_bind_cpus": _default_only("tandem does not bind workers to NUMA nodes"),
    "nnodes": _default_only("one node (a Ray cluster: executor_backend ray, ray_address)"),
    "node_rank": _default_only("one node (a Ray cluster: executor_backend ray, ray_address)"),
    "ray_workers_use_nsight": _default_only("no GPU profiler in Ray workers"),
    "additional_config": _default_only("tandem reads no platform plugin config"),
    "enable_return_routed_experts": _default_only("tandem runs dense models"),
    "return_sampling_mask": _default_only("outputs carry tokens, text and logprobs"),
    "enable_prompt_embeds": _default_only("prompts are text or token ids"),
    "tokens_only": _default_only("tandem detokenizes every output"),
    "weight_transfer_config": _default_only("weights are loaded once from the checkpoint"),
    "fail_on_environ_validation": _default_only("tandem reads only its TANDEM_* overrides"),
    "enable_fault_tolerance": _default_only("a failed worker fails its requests and the engine (EngineDeadError)"),
    "fault_tolerance_config": _default_only("a failed worker fails its requests and the engine (EngineDeadError)"),
    "logging_config": _default_only("tandem logs with Python's logging as configured by the caller"),
    "log_config_file": _default_only("tandem logs with Python's logging as configured by the caller"),
    "watermark_config": _default_only("tandem has no output watermarking"),
    "diffusion_config": _default_only("tandem runs autoregressive models"),
    "engram_config": _default_only(_MODEL_LOAD),
    "aux_output_config": _default_only("outputs carry tokens, text and logprobs"),
    "profiler_config": _default_only("profile with tandem's traces (--trace)"),
    **{n: _default_only(_OBS) for n in (
        "otlp_traces_endpoint", "collect_detailed_traces", "per_request_spec_decode_metrics", "kv_cache_metrics",
        "kv_cache_metrics_sample", "custom_histogram_buckets", "enable_mfu_metrics",
        "enable_logging_iteration_details", "jit_monitor_mode", "jit_monitor_verbose", "enable_mm_processor_stats",
    )},
    **{n: _default_only(_MM) for n in (
        "language_model_only", "enable_mm_embeds", "interleave_mm_strings", "media_io_kwargs",
        "mm_processor_kwargs", "mm_processor_cache_gb", "mm_processor_cache_type", "mm_hasher_algorithm",
        "mm_shm_cache_max_object_size_mb", "mm_encoder_only", "mm_encoder_tp_mode", "mm_encoder_attn_backend",
        "mm_encoder_attn_dtype", "mm_encoder_fp8_scale_path", "mm_encoder_fp8_scale_save_path",
        "mm_encoder_fp8_scale_save_margin", "skip_mm_profiling", "video_pruning_rate", "video_pruning_method",
        "mm_tensor_ipc", "mm_processor_device", "mm_ipc_gpu_memory_gb", "mm_device_do_normalize",
        "ec_transfer_config", "ec_manager_config",
    )},
    **{n: _default_only(_LORA) for n in (
        "enable_lora", "max_loras", "max_lora_rank", "default_mm_loras", "fully_sharded_loras", "max_cpu_loras",
        "lora_dtype", "lora_target_modules", "enable_tower_connector_lora", "specialize_active_lora",
        "enable_mixed_moe_lora_format", "enable_moe_shared_loras", "max_lora_cls_labels",
    )},
    **{n: _default_only(_DP) for n in (
        "data_parallel_size", "data_parallel_rank", "data_parallel_start_rank", "data_parallel_size_local",
        "data_parallel_address", "data_parallel_rpc_port", "data_parallel_hybrid_lb", "data_parallel_external_lb",
        "data_parallel_multi_port_external_lb", "data_parallel_backend", "enable_hc_sp", "enable_expert_parallel",
        "enable_batch_sharded_sampling", "enable_ep_weight_filter", "all2all_backend", "enable_elastic_ep",
        "elastic_ep_max_dp_size", "enable_dbo", "ubatch_size", "dbo_decode_token_threshold", "dp_sync_interval",
        "dbo_prefill_token_threshold", "disable_nccl_for_dp_synchronization", "eplb_config", "enable_eplb",
        "expert_placement_strategy",
    )},
    **{n: _default_only(_CP) for n in (
        "prefill_context_parallel_size", "decode_context_parallel_size", "dcp_comm_backend", "dcp_q_replicate",
        "dcp_kv_cache_interleave_size", "cp_kv_cache_interleave_size",
    )},
    **{n: _default_only(_MAMBA) for n in (
        "mamba_config", "mamba_cache_dtype", "mamba_ssm_cache_dtype", "mamba_block_size", "mamba_cache_mode",
        "enable_mamba_shared_prefix_checkpoint", "replayssm_buffer_len", "use_replayssm", "mamba_backend",
        "mamba_ssu_algorithm", "enable_mamba_cache_stochastic_rounding", "mamba_cache_philox_rounds",
    )},
    **{n: _default_only(_OFFLOAD) for n in (
        "offload_backend", "cpu_offload_gb", "cpu_offload_params", "offload_group_size", "offload_num_in_group",
        "offload_prefetch_step", "offload_params", "kv_offloading_size", "kv_offloading_backend",
        "pt_load_map_location",
    )},
    **{n: _default_only(_KV_TRANSFER) for n in ("kv_transfer_config", "kv_events_config")},
    **{n: _default_only(_SLEEP) for n in (
        "enable_sleep_mode", "sleep_mode_offload_cudagraph", "sleep_preserve_parameter_names",
        "enable_cumem_allocator", "enable_nccl_comm_suspend",
    )},
    "model_loader_extra_config": _default_only(_MODEL_LOAD),
    # -- names older vLLM releases took (not in the list; scripts still pass them) -----------------------------
    "swap_space": _accepted("tandem recomputes preempted requests and never swaps KV to host memory; recorded"),
    "disable_log_requests": _accepted("tandem logs no line per request; recorded"),
}


_DRAFT = "the drafter runs beside the target, on its ranks, in its dtype (draft_dtype) and KV layout"
_POLICY = "speculative_config.policy chooses drafts per request and step"

# vLLM's speculative_config keys that are not tandem's own (SpeculativeConfig's fields are flags here).
SPEC_ANSWERS: dict[str, Answer] = {
    "enforce_eager": _accepted(_NO_GPU),
    "moe_backend": _accepted(_NO_GPU),
    "attention_backend": _accepted(_NO_GPU),
    "disable_padded_drafter_batch": _accepted("a GPU batching knob: tandem's drafter batch is unpadded; recorded"),
    "max_model_len": _accepted("the drafter covers the target's max_model_len; recorded"),
    "draft_tensor_parallel_size": _default_only(_DRAFT, 1),
    "tensor_parallel_size": _default_only(_DRAFT, 1),
    "quantization": _default_only(_DRAFT),
    "kv_cache_dtype": _default_only(_DRAFT, "auto"),
    "revision": _default_only(_LOCAL),
    "code_revision": _default_only(_LOCAL),
    "draft_load_config": _default_only(_DRAFT),
    "index_share_for_mtp_iteration": _default_only(_DRAFT),
    "disable_eagle_block_drop": _default_only(_DRAFT),
    "use_local_argmax_reduction": _default_only(_DRAFT),
    "use_heterogeneous_vocab": _default_only(_DRAFT),
    "parallel_drafting": _default_only("drafts are proposed one position after another"),
    "target_model_config": _default_only("set by vLLM itself"),
    "target_parallel_config": _default_only("set by vLLM itself"),
    "draft_model_config": _default_only("set by vLLM itself"),
    "draft_parallel_config": _default_only("set by vLLM itself"),
    "num_speculative_tokens_per_batch_size": _default_only(_POLICY),
    "enable_adaptive_verification": _default_only(_POLICY),
    "rejection_sample_method": _default_only("tandem's rejection sampler is the standard, distribution-exact one"),
    "draft_sample_method": _default_only("drafts are the drafter's argmax", "greedy"),
    "synthetic_acceptance_rates": _default_only("acceptance is the rejection sampler's, never synthetic"),
    "synthetic_acceptance_length": _default_only("acceptance is the rejection sampler's, never synthetic"),
    "dspark_draft_topk": _default_only(_DRAFT),
}


@cache
def vllm_args() -> tuple[dict[str, Any], ...]:
    """vLLM's engine arguments as data: name, type (its annotation) and default (or ``default_expr``)."""
    return tuple(json.loads(DATA.read_text())["args"])


@cache
def vllm_speculative_keys() -> tuple[dict[str, Any], ...]:
    """vLLM's ``speculative_config`` keys as data, like :func:`vllm_args`."""
    return tuple(json.loads(DATA.read_text())["speculative_config"])


@cache
def _defaults(section: str = "args") -> dict[str, Any]:
    rows = vllm_args() if section == "args" else vllm_speculative_keys()
    return {a["name"]: a.get("default") for a in rows}


def _inert(name: str, value: Any, answer: Answer, section: str = "args") -> bool:
    """None, vLLM's default, one of ``allowed``, or "off" / empty where vLLM's default is off or empty."""
    default = _defaults(section).get(name)
    if value is None or value == default or value in answer.allowed:
        return True
    empty = value is False or (isinstance(value, (str, list, tuple, dict, set)) and not value)
    return empty and default is not True


def _refuse(name: str, value: Any, answer: Answer, section: str = "args") -> ValueError:
    shown = f"{value!r}" if len(repr(value)) < 80 else f"{repr(value)[:77]}..."
    shown_name = name if section == "args" else f"{section}.{name}"
    return ValueError(f"{shown_name}={shown} is not supported: {answer.meaning} (vLLM's default "
                      f"{_defaults(section).get(name)!r} is accepted)")


def translate_speculative(value: dict[str, Any], own: set[str]) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
    """A ``speculative_config`` dict: tandem's keys (``own``) kept, vLLM's others answered as for engine
    arguments (names in errors are ``speculative_config.<key>``); unknown keys left for the caller."""
    out: dict[str, Any] = {}
    accepted = []
    for key, v in value.items():
        answer = SPEC_ANSWERS.get(key)
        if key in own or answer is None:
            out[key] = v
        elif answer.kind == "accepted":
            if not _inert(key, v, answer, "speculative_config"):
                accepted.append((f"speculative_config.{key}", repr(v)))
        elif not _inert(key, v, answer, "speculative_config"):
            raise _refuse(key, v, answer, "speculative_config")
    return out, tuple(accepted)


def translate(kw: dict[str, Any], flags: set[str]) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
    """Split engine keywords into tandem's (``flags`` and what honoured vLLM names become) and the accepted
    vLLM ones (recorded as ``(name, repr(value))``); a vLLM name whose value tandem cannot honour raises a
    ``ValueError`` naming it. Names that are neither tandem's nor vLLM's are left for the caller to refuse."""
    out: dict[str, Any] = {}
    accepted = []
    for name, value in kw.items():
        answer = ANSWERS.get(name)
        if name in flags or answer is None:
            out[name] = value
        elif answer.kind == "honoured":
            if value is not None:
                out.update(answer.to(value))  # type: ignore[misc]
        elif answer.kind == "accepted":
            if not _inert(name, value, answer):
                accepted.append((name, repr(value)))
        elif not _inert(name, value, answer):
            raise _refuse(name, value, answer)
    spec = {k[len("_spec_"):]: out.pop(k) for k in list(out) if k.startswith("_spec_")}
    if spec:
        if out.get("speculative_config") is not None:
            raise ValueError("spec_method / spec_model / spec_tokens and speculative_config are one setting; "
                             "pass one")
        if "method" not in spec or "num_speculative_tokens" not in spec:
            raise ValueError("spec_method and spec_tokens go together (vLLM's shorthand for speculative_config)")
        out["speculative_config"] = {k: v for k, v in spec.items() if v is not None}
    return out, tuple(accepted)


def table() -> str:
    """docs/VLLM_ARGS.md's table: every vLLM engine argument and its answer."""
    rows = ["| argument | answer | meaning in tandem |", "|---|---|---|"]
    for a in vllm_args():
        ans = ANSWERS[a["name"]]
        rows.append(f"| `{a['name']}` | {ans.kind.replace('_', ' ')} | {ans.meaning} |")
    extra = sorted(set(ANSWERS) - {a["name"] for a in vllm_args()})
    for name in extra:
        rows.append(f"| `{name}` (older vLLM) | {ANSWERS[name].kind.replace('_', ' ')} | {ANSWERS[name].meaning} |")
    from tandem.speculative_config import SpeculativeConfig

    own = [a["name"] for a in vllm_speculative_keys() if a["name"] not in SPEC_ANSWERS]
    extra = [f for f in SpeculativeConfig.__dataclass_fields__ if f not in own]
    rows += ["", f"`speculative_config` keys (tandem's own: {', '.join(own)}; tandem's alone: {', '.join(extra)}):",
             "", "| key | answer | meaning in tandem |", "|---|---|---|"]
    for a in vllm_speculative_keys():
        ans = SPEC_ANSWERS.get(a["name"])
        if ans is not None:
            rows.append(f"| `{a['name']}` | {ans.kind.replace('_', ' ')} | {ans.meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table(), end="")
