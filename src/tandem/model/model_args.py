"""Architecture hyper-parameters, read from a Hugging Face ``config.json`` or from GGUF metadata.

One dataclass for every supported family; the per-family differences are data (``attention_bias`` for
Qwen2's QKV bias, ``qk_norm`` for Qwen3's and Gemma 3's per-head q/k RMSNorm, and Gemma 3's: ``sandwich_norms``
(a norm after attention and after the MLP, before each residual add), ``norm_offset`` (RMSNorm gains stored
zero-centred: the gain is ``1 + w``), ``embed_scale`` (embeddings times ``sqrt(hidden)``), ``hidden_act``
``gelu_tanh``, ``query_pre_attn_scalar`` (attention scale ``scalar ** -0.5``), and ``layer_windows``:
sliding-window layers that attend to their last ``window`` positions with their own RoPE base
``rope_local_theta``), so one transformer implementation serves all.
Weights always use Hugging Face tensor names (``model.layers.{i}.self_attn.q_proj.weight`` ...), whatever
file format they came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
}
FAMILIES = ("llama", "qwen2", "qwen3", "gemma3")
HIDDEN_ACTS = ("silu", "gelu_tanh")


def gemma3_layer_windows(num_layers: int, window: int, pattern: int = 6) -> tuple[int, ...]:
    """Gemma 3's layout: every ``pattern``-th layer attends globally (0), the others to ``window``
    positions (transformers' default ``layer_types``)."""
    return tuple(0 if (i + 1) % pattern == 0 else window for i in range(num_layers))


@dataclass(frozen=True)
class ModelArgs:
    family: str  # one of FAMILIES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # HF ``rope_scaling`` dict (e.g. {"rope_type": "llama3", "factor": 8.0, ...}); None = plain RoPE.
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3, Gemma 3)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Gemma 3 (see the module docstring); the defaults are Llama's.
    sandwich_norms: bool = False
    norm_offset: float = 0.0
    embed_scale: bool = False
    hidden_act: str = "silu"
    query_pre_attn_scalar: float | None = None  # None: the scale is head_dim ** -0.5
    # Per layer: 0 attends to every earlier position, w > 0 to the last w positions (itself included).
    # Empty: every layer global.
    layer_windows: tuple[int, ...] = ()
    rope_local_theta: float | None = None  # the sliding-window layers' RoPE base; None: rope_theta

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unsupported model family {self.family!r}; supported: {FAMILIES}")
        if self.hidden_act not in HIDDEN_ACTS:
            raise ValueError(f"hidden_act must be one of {HIDDEN_ACTS}, got {self.hidden_act!r}")
        if self.layer_windows and (
            len(self.layer_windows) != self.num_hidden_layers or min(self.layer_windows) < 0
        ):
            raise ValueError(
                f"layer_windows must give a window >= 0 for each of the {self.num_hidden_layers} layers, "
                f"got {self.layer_windows!r}"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model config field {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    def window(self, layer: int) -> int:
        """The sliding window of ``layer``; 0 = global attention."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def sliding(self) -> bool:
        """Whether any layer attends through a sliding window."""
        return any(self.layer_windows)

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], source: str = "config.json") -> ModelArgs:
        archs = config.get("architectures") or []
        family = None
        for arch in archs:
            family = SUPPORTED_ARCHITECTURES.get(arch)
            if family:
                break
        if family is None:
            model_type = config.get("model_type")
            family = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                      "gemma3_text": "gemma3"}.get(str(model_type))
        if family is None:
            raise ValueError(
                f"{source}: unsupported architectures={archs!r} "
                f"(model_type={config.get('model_type')!r}); "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )

        def need(key: str) -> Any:
            if key not in config:
                raise ValueError(f"{source}: missing field {key!r}")
            return config[key]

        heads = int(need("num_attention_heads"))
        hidden = int(need("hidden_size"))
        eos = config.get("eos_token_id")
        # transformers >= 5 writes ``rope_parameters`` ({"rope_theta", "rope_type", ...}) in place
        # of the older top-level ``rope_theta`` / ``rope_scaling``.
        rope = config.get("rope_parameters") or {}
        rope_theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_scaling = config.get("rope_scaling")
        if rope_scaling is None and rope.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        gemma: dict[str, Any] = {}
        if family == "gemma3":
            rope_theta, rope_scaling, gemma = _gemma3_fields(config, int(need("num_hidden_layers")), source)
        return cls(
            family=family,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6 if family != "llama" else 1e-5)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", family == "qwen2")),
            qk_norm=family in ("qwen3", "gemma3"),
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
            **gemma,
        )


def _gemma3_fields(config: dict[str, Any], layers: int, source: str) -> tuple[float, Any, dict[str, Any]]:
    """(global rope_theta, its rope_scaling, Gemma 3's own ModelArgs fields) from a ``gemma3_text`` config:
    transformers >= 5 nests RoPE per layer type in ``rope_parameters``, older configs use ``rope_theta`` /
    ``rope_local_base_freq`` / ``rope_scaling``."""
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if config.get(key) is not None:
            raise ValueError(f"{source}: {key} = {config[key]!r} is not supported (Gemma 2's soft-capping)")
    if config.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ValueError(f"{source}: hidden_activation {config['hidden_activation']!r} is not supported")
    params = config.get("rope_parameters") or {}
    full = params.get("full_attention") or {}
    local = params.get("sliding_attention") or {}
    theta = float(full.get("rope_theta", config.get("rope_theta", 1_000_000.0)))
    local_theta = float(local.get("rope_theta", config.get("rope_local_base_freq", 10_000.0)))
    scaling = config.get("rope_scaling")
    if scaling is None and full.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in full.items() if k != "rope_theta"}
    window = int(config.get("sliding_window") or 0)
    types = config.get("layer_types")
    if types is None:
        windows = gemma3_layer_windows(layers, window, int(config.get("sliding_window_pattern", 6)))
    else:
        if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
            raise ValueError(f"{source}: layer_types {types!r} does not name one attention type per layer")
        windows = tuple(window if t == "sliding_attention" else 0 for t in types)
    return theta, scaling, gemma3_fields(float(config.get("query_pre_attn_scalar", 256)), windows, local_theta)


def gemma3_fields(query_pre_attn_scalar: float, layer_windows: tuple[int, ...], rope_local_theta: float) -> dict[str, Any]:
    """Gemma 3's own ``ModelArgs`` fields (the module docstring), from a config.json or GGUF metadata."""
    return {
        "sandwich_norms": True, "norm_offset": 1.0, "embed_scale": True, "hidden_act": "gelu_tanh",
        "query_pre_attn_scalar": query_pre_attn_scalar, "layer_windows": layer_windows,
        "rope_local_theta": rope_local_theta,
    }  # fmt: skip
