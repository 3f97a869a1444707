"""Model hyper-parameters and weights from a GGUF file, under Hugging Face names.

Three things differ from a Hugging Face checkpoint and are undone here:

1. Names: llama.cpp's ``blk.N.attn_q.weight`` is HF's ``model.layers.N.self_attn.q_proj.weight``.
2. Storage: tensors may be block-quantized. With ``keep_quantized`` (``quantization="gguf"``) every
   matrix in a type the native kernels compute on stays in its blocks (model/block_quant.py); everything
   else is dequantized to float32 through gguf-py (``quants.py``), then cast to the requested dtype.
3. Row order of ``attn_q`` / ``attn_k`` for the ``llama`` architecture: llama.cpp's converter
   regroups each head's rows from HF's rotate-half layout (first half of the head dims, then the
   second half) into interleaved pairs, because its RoPE kernel rotates adjacent elements. A head's
   row ``r = 2 * j + a`` in the file is HF row ``a * head_dim / 2 + j``. Qwen and Gemma 3 files are not
   permuted (llama.cpp runs those with rotate-half RoPE).
4. Gemma 3's RMSNorm gains: the checkpoint stores ``w`` and the model multiplies by ``1 + w``; llama.cpp's
   converter writes ``1 + w`` into the file. The loader subtracts the 1 again (as transformers does), so the
   HF-named tensors hold the checkpoint's values and one set of weight code serves both formats.
   Gemma 3's file names its norms by position: ``post_attention_norm`` / ``ffn_norm`` / ``post_ffw_norm`` are
   HF's ``post_attention_layernorm`` / ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm`` (for
   Llama, ``ffn_norm`` is ``post_attention_layernorm``). The file does not store the layer types: the
   sliding window applies to five layers of every six, as in transformers' default ``layer_types``.

A missing ``output.weight`` means the output projection is tied to ``token_embd``.
"""

from __future__ import annotations

import logging
import re

import torch
from gguf import GGML_QUANT_SIZES

from tandem.model import block_repack
from tandem.model.block_quant import FLOAT_TYPES, KERNEL_TYPES, BlockQuantWeight, QType
from tandem.model.loader.gguf_file import GGUFFile
from tandem.model.loader.quants import dequantize, type_name

log = logging.getLogger(__name__)
from tandem.model.loader.tensor_spec import check_tensors, in_layers
from tandem.model.model_args import ModelArgs, gemma3_fields, gemma3_layer_windows

# general.architecture -> tandem family
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GEMMA3_LAYER_NAMES = _LAYER_NAMES | {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_tensor_name(gguf_name: str, path: object = "GGUF file", arch: str = "llama") -> str:
    """The Hugging Face name of a llama.cpp tensor of architecture ``arch``; ``ValueError`` if tandem has
    no use for it."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _GEMMA3_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
    match = _LAYER_RE.fullmatch(gguf_name)
    if match and match.group(2) in names:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{names[part]}.{kind}"
    if gguf_name == "rope_freqs.weight":
        raise ValueError(
            f"{path}: tensor 'rope_freqs.weight' (per-frequency RoPE factors, e.g. Llama 3.1 "
            "rope scaling) is not supported"
        )
    raise ValueError(f"{path}: tensor {gguf_name!r} has no Hugging Face equivalent tandem knows")


def _rope_scaling(gf: GGUFFile, arch: str) -> dict[str, object] | None:
    kind = gf.get(f"{arch}.rope.scaling.type")
    factor = gf.get(f"{arch}.rope.scaling.factor")
    if kind is None and gf.get(f"{arch}.rope.scale_linear") is not None:  # older files
        kind, factor = "linear", gf.get(f"{arch}.rope.scale_linear")
    if kind in (None, "none"):
        return None
    if kind not in ("linear", "yarn"):
        raise ValueError(f"{gf.path}: unsupported {arch}.rope.scaling.type {kind!r}")
    scaling: dict[str, object] = {"rope_type": kind, "factor": float(factor or 1.0)}
    original = gf.get(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def gguf_model_args(gf: GGUFFile) -> ModelArgs:
    """``ModelArgs`` from the ``{arch}.*`` metadata and the tensor index of ``gf``."""
    arch = gf.require("general.architecture")
    family = GGUF_ARCHITECTURES.get(arch)
    if family is None:
        raise ValueError(
            f"{gf.path}: unsupported general.architecture {arch!r}; supported: "
            f"{sorted(GGUF_ARCHITECTURES)}"
        )
    hidden = int(gf.require(f"{arch}.embedding_length"))
    heads = int(gf.require(f"{arch}.attention.head_count"))
    head_dim = int(gf.get(f"{arch}.attention.key_length", hidden // heads))
    rope_dim = gf.get(f"{arch}.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        raise ValueError(
            f"{gf.path}: {arch}.rope.dimension_count = {rope_dim} differs from head_dim "
            f"{head_dim}; partial rotary embeddings are not supported"
        )
    vocab = gf.get(f"{arch}.vocab_size")
    if vocab is None:
        embd = gf.tensors.get("token_embd.weight")
        vocab = embd.shape[0] if embd else len(gf.require("tokenizer.ggml.tokens"))
    eos_ids = [
        int(gf.get(f"tokenizer.ggml.{key}"))
        for key in ("eos_token_id", "eot_token_id", "eom_token_id")
        if gf.get(f"tokenizer.ggml.{key}") is not None
    ]
    bos = gf.get("tokenizer.ggml.bos_token_id")
    layers = int(gf.require(f"{arch}.block_count"))
    gemma: dict[str, object] = {}
    if family == "gemma3":
        window = int(gf.get(f"{arch}.attention.sliding_window", 0))
        gemma = gemma3_fields(float(head_dim), gemma3_layer_windows(layers, window), 10_000.0)
    return ModelArgs(
        family=family,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(gf.require(f"{arch}.feed_forward_length")),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(gf.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(gf.require(f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(gf.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(gf, arch),
        max_position_embeddings=int(gf.get(f"{arch}.context_length", 2048)),
        tie_word_embeddings="output.weight" not in gf.tensors,
        attention_bias="blk.0.attn_q.bias" in gf.tensors,
        qk_norm=family in ("qwen3", "gemma3"),
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=tuple(dict.fromkeys(eos_ids)),
        **gemma,  # type: ignore[arg-type]
    )


def unpermute_rows(tensor: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Invert llama.cpp's Q/K row interleaving (see the module docstring); works on weights
    ``[n_heads * head_dim, in]`` and biases ``[n_heads * head_dim]``."""
    rows = tensor.shape[0]
    half = rows // n_heads // 2
    rest = tensor.shape[1:]
    return tensor.reshape(n_heads, half, 2, *rest).transpose(1, 2).reshape(rows, *rest)


def is_quantized_file(gf: GGUFFile) -> bool:
    """Whether any matrix of ``gf`` is stored in a block type the native kernels compute on."""
    return any(len(t.shape) == 2 and t.ggml_type in KERNEL_TYPES for t in gf.tensors.values())


def unkernelled_types(gf: GGUFFile) -> list[str]:
    """The block types of ``gf``'s layer matrices that no native kernel computes on (e.g. Q3_K, IQ4_XS):
    ``quantization="gguf"`` needs every layer matrix in its blocks."""
    return sorted({
        type_name(t.ggml_type) for t in gf.tensors.values()
        if t.name.startswith("blk.") and len(t.shape) == 2
        and t.ggml_type not in KERNEL_TYPES and t.ggml_type not in FLOAT_TYPES
    })  # fmt: skip


def load_gguf_tensors(
    gf: GGUFFile, args: ModelArgs, dtype: torch.dtype, keep_quantized: bool = False,
    num_layers: int | None = None,
) -> dict[str, torch.Tensor | BlockQuantWeight]:
    """Every weight of ``gf`` under its HF name (CPU): dequantized and cast to ``dtype``, or with
    ``keep_quantized`` a :class:`BlockQuantWeight` for each matrix in a kernel type. A quantized type
    without a kernel is dequantized through gguf-py, and named once in the log. With ``num_layers`` the
    decoder layers from that index on are left unread."""
    arch = str(gf.require("general.architecture"))
    names = {hf_tensor_name(name, gf.path, arch): name for name in gf.tensors}
    check_tensors({hf: gf.tensors[g].shape for hf, g in names.items()}, args, gf.path)
    permuted = {"q_proj": args.num_attention_heads, "k_proj": args.num_key_value_heads}
    out: dict[str, torch.Tensor | BlockQuantWeight] = {}
    fallback: set[str] = set()
    for hf, gname in names.items():
        if not in_layers(hf, num_layers):
            continue
        info = gf.tensors[gname]
        module = hf.split(".")[-2]
        heads = permuted.get(module) if args.family == "llama" else None
        if keep_quantized and len(info.shape) == 2 and info.ggml_type in KERNEL_TYPES:
            weight = BlockQuantWeight.from_raw(gf.raw(gname), info.ggml_type, info.shape, gname)
            if heads is not None:
                order = unpermute_rows(torch.arange(info.shape[0]).unsqueeze(1), heads)[:, 0]
                weight = weight.take_rows(order)
            out[hf] = weight
            continue
        if keep_quantized and info.ggml_type not in FLOAT_TYPES:
            fallback.add(type_name(info.ggml_type))
        tensor = dequantize(gf.raw(gname), info.ggml_type, info.shape, gname)
        if heads is not None:
            tensor = unpermute_rows(tensor, heads)
        if args.norm_offset and hf.endswith("norm.weight"):
            tensor = tensor - args.norm_offset  # the file stores 1 + w (the module docstring)
        out[hf] = tensor.to(dtype).contiguous()
    if fallback:
        log.warning(
            "%s: no native kernel for %s; those tensors are dequantized at load (gguf-py)",
            gf.path.name, ", ".join(sorted(fallback)),
        )
    return out


def gguf_weight_plan(gf: GGUFFile, keep_quantized: bool, elem_bytes: int) -> tuple[int, list[str]]:
    """(resident weight bytes once loaded, the block types kept) from the tensor index alone: with
    ``keep_quantized`` a matrix in a kernel type keeps its stored bytes, everything else takes
    ``elem_bytes`` per element (the compute dtype). The layer norms' gains are folded into float weights
    (weights.py) and kept as the stacks' input gains beside blocks, as many float32 values."""
    total, types = 0, set()
    for info in gf.tensors.values():
        if not keep_quantized and info.name.endswith(("attn_norm.weight", "ffn_norm.weight")):
            continue
        n = 1
        for d in info.shape:
            n *= d
        if keep_quantized and len(info.shape) == 2 and info.ggml_type in KERNEL_TYPES:
            total += info.nbytes
            types.add(type_name(info.ggml_type))
            if info.ggml_type == QType.Q5_0:  # whole groups of 16 rows widened to Q8_0 (BlockQuantWeight.repacked)
                rows, blocks = info.shape[0], info.nbytes // GGML_QUANT_SIZES[QType.Q5_0][1]
                extra = GGML_QUANT_SIZES[QType.Q8_0][1] - GGML_QUANT_SIZES[QType.Q5_0][1]
                total += (rows - rows % block_repack.GROUP) * (blocks // rows) * extra
        else:
            total += n * elem_bytes
    return total, sorted(types)
