"""Architecture hyper-parameters, read from a Hugging Face ``config.json`` or from GGUF metadata.

One dataclass for every supported family; the per-family differences are flags (``attention_bias`` for
Qwen2's QKV bias, ``qk_norm`` for Qwen3's per-head q/k RMSNorm), so one transformer implementation serves all.
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
}


@dataclass(frozen=True)
class ModelArgs:
    family: str  # "llama" | "qwen2" | "qwen3"
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
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in ("llama", "qwen2", "qwen3"):
            raise ValueError(f"unsupported model family {self.family!r}")
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
            family = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}.get(
                str(model_type)
            )
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
            qk_norm=family == "qwen3",
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
        )
