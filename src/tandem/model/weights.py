"""From a checkpoint's Hugging Face-named tensors to the transformer's fused, load-time-transformed weights.

Checked here, once: every expected tensor is present with the expected shape, nothing unknown is left over
(a typo'd or foreign tensor is an error that names it). Transformed here, once:
- q, k and v projections are concatenated into one ``qkv`` matrix (one matmul per layer instead of three);
- gate and up projections into one ``gate_up`` matrix;
- q/k rows (and their bias and per-head norm weights) are permuted to interleaved RoPE pairs (see rope.py);
- each RMSNorm gain that feeds a projection (the input and the pre-MLP norms) is multiplied, with
  ``sqrt(hidden)``, into that projection's input columns (``W @ (g * x) == (W * g) @ x``): the layer
  then only computes ``x / sqrt(sum(x^2) + hidden * eps)`` (:func:`tandem.model.layers.unit_rms`). The
  final norm keeps its own gain (times ``sqrt(hidden)``), so ``hidden_states`` are the checkpoint's, and so
  do Gemma 3's norms after attention and after the MLP (``sandwich_norms``: they normalize a product's
  output, nothing to fold into). A gain stored zero-centred (``norm_offset``, Gemma 3) is ``offset + w``.

Block-quantized matrices (:class:`~tandem.model.block_quant.BlockQuantWeight`, ``quantization="gguf"``) take
the same transforms without leaving their blocks: row permutations and concatenations move whole rows,
and a gain that cannot be folded into blocks is kept beside the matrix and applied to its input. Each
assembled matrix then takes the interleaved layout the few-row kernels stream (block_repack.py; same bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from tandem.model.block_quant import BlockQuantWeight
from tandem.model.quant import Int8Weight
from tandem.model.loader.tensor_spec import expected_tensors
from tandem.model.model_args import ModelArgs
from tandem.model.parallel import ShardPlan
from tandem.model.rope import interleave_heads

# Tensors some checkpoints carry that the model recomputes and never reads.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


Matrix = torch.Tensor | BlockQuantWeight | Int8Weight


@dataclass(frozen=True)
class LayerWeights:
    qkv: Matrix  # [(heads + 2 * kv_heads) * head_dim, hidden], input-norm gain folded in
    qkv_bias: torch.Tensor | None
    # [heads + kv_heads, head_dim]: q_norm's gain for each q head, then k_norm's for each k head.
    qk_norm: torch.Tensor | None
    o_proj: Matrix  # [hidden, heads * head_dim]
    o_bias: torch.Tensor | None
    gate_up: Matrix  # [2 * intermediate, hidden], the pre-MLP norm's gain folded in
    down: Matrix  # [hidden, intermediate]
    # sandwich_norms (Gemma 3): [hidden] gains times sqrt(hidden) of the norms after attention / the MLP.
    post_attn_norm: torch.Tensor | None = None
    post_ffn_norm: torch.Tensor | None = None


@dataclass(frozen=True)
class ModelWeights:
    embed: Matrix  # [vocab, hidden]
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor  # [hidden], the final norm's gain times sqrt(hidden)
    lm_head: Matrix | None  # None when tied to ``embed``


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor name the model reads, with its shape (loader/tensor_spec.py, the one list)."""
    return expected_tensors(args)


def _optional_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Tensors a checkpoint may or may not have: o_proj bias (Llama with ``attention_bias``), a tied
    checkpoint's redundant ``lm_head.weight`` (ignored)."""
    out: dict[str, tuple[int, ...]] = {}
    for i in range(args.num_hidden_layers):
        out[f"model.layers.{i}.self_attn.o_proj.bias"] = (args.hidden_size,)
    if args.tie_word_embeddings:
        out["lm_head.weight"] = (args.vocab_size, args.hidden_size)
    return out


def validate(args: ModelArgs, tensors: Mapping[str, Matrix]) -> None:
    """Raise ``ValueError`` naming the first missing, misshapen or unexpected tensor."""
    required = expected_shapes(args)
    optional = _optional_shapes(args)
    for name, shape in required.items():
        if name not in tensors:
            raise ValueError(f"checkpoint is missing tensor {name!r} (expected shape {shape})")
    for name, tensor in tensors.items():
        found = required.get(name, optional.get(name))
        if found is None:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            raise ValueError(f"checkpoint has unexpected tensor {name!r} for a {args.family} model")
        if tuple(tensor.shape) != found:
            raise ValueError(
                f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {found} from the config"
            )
        if isinstance(tensor, BlockQuantWeight):
            continue
        if not tensor.is_floating_point():
            raise ValueError(f"tensor {name!r} has dtype {tensor.dtype}, expected a floating type")


def _attention_vectors(
    args: ModelArgs,
    tensors: Mapping[str, Matrix],
    a: str,
    get: Callable[[str], torch.Tensor],
    out: Callable[[torch.Tensor], torch.Tensor],
    s: ShardPlan,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(qkv bias, per-head q/k norm, o bias) of the layer whose attention names start with ``a``, for shard
    ``s``; ``None`` where the family has none. ``get``: a tensor as float32, ``out``: to the model dtype."""
    heads, kv_heads, hd = args.num_attention_heads, args.num_key_value_heads, args.head_dim
    qs, kvs = s.q_rows(hd), s.kv_rows(hd)
    qkv_bias = qk_norm = o_bias = None
    if args.attention_bias:
        qb = interleave_heads(get(a + "q_proj.bias"), heads, hd)[qs]
        kb = interleave_heads(get(a + "k_proj.bias"), kv_heads, hd)[kvs]
        qkv_bias = out(torch.cat([qb, kb, get(a + "v_proj.bias")[kvs]]))
    if args.qk_norm:
        qn = interleave_heads(get(a + "q_norm.weight") + args.norm_offset, 1, hd)
        kn = interleave_heads(get(a + "k_norm.weight") + args.norm_offset, 1, hd)
        qk_norm = out(torch.cat([qn.expand(s.num_heads, hd), kn.expand(s.num_kv_heads, hd)]))
    if a + "o_proj.bias" in tensors:
        o_bias = out(get(a + "o_proj.bias"))
    return qkv_bias, qk_norm, o_bias


def ffn_norm_name(args: ModelArgs) -> str:
    """The norm in front of the MLP: Llama calls it ``post_attention_layernorm``; with ``sandwich_norms``
    that name is the norm after attention, and the MLP's is ``pre_feedforward_layernorm``."""
    return "pre_feedforward_layernorm" if args.sandwich_norms else "post_attention_layernorm"


def _sandwich(args: ModelArgs, p: str, gain: Callable[[str], torch.Tensor],
              out: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    """The post-attention / post-MLP gains of layer ``p`` (``sandwich_norms``), else nothing."""
    if not args.sandwich_norms:
        return {}
    return {"post_attn_norm": out(gain(p + "post_attention_layernorm.weight")),
            "post_ffn_norm": out(gain(p + "post_feedforward_layernorm.weight"))}


def _quantized_weights(args: ModelArgs, tensors: Mapping[str, Matrix], device: torch.device | str,
                       dtype: torch.dtype, activations: str) -> ModelWeights:
    """:func:`prepare_weights` for a checkpoint whose matrices are block-quantized (one rank, the CPU):
    the same fusions, permutations and gains, on rows of blocks; vectors and any plain matrix as usual."""
    heads, kv_heads, hd = args.num_attention_heads, args.num_key_value_heads, args.head_dim

    def vec(name: str) -> torch.Tensor:
        return tensors[name].to(device=device, dtype=torch.float32)  # type: ignore[union-attr]

    def gain(name: str) -> torch.Tensor:
        return (vec(name) + args.norm_offset) * args.hidden_size**0.5

    def quant(name: str) -> BlockQuantWeight:
        t = tensors[name]
        if isinstance(t, BlockQuantWeight):
            return t
        raise ValueError(f"tensor {name!r}: quantization 'gguf' needs every layer matrix block-quantized")

    def interleaved(w: BlockQuantWeight, n: int) -> BlockQuantWeight:
        order = interleave_heads(torch.arange(w.shape[0]).unsqueeze(1), n, hd)[:, 0]
        return w.take_rows(order)

    def out(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).contiguous()

    def plain(t: Matrix) -> Matrix:
        return fast(t) if isinstance(t, BlockQuantWeight) else out(t.to(device=device))

    def fast(w: BlockQuantWeight) -> BlockQuantWeight:
        return w.repacked().with_activations(activations)

    single = ShardPlan.single(args)

    layers = []
    for i in range(args.num_hidden_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        q = interleaved(quant(a + "q_proj.weight"), heads)
        k = interleaved(quant(a + "k_proj.weight"), kv_heads)
        qkv = BlockQuantWeight.stack([q, k, quant(a + "v_proj.weight")], f"{p}qkv")
        gate_up = BlockQuantWeight.stack([quant(p + "mlp.gate_proj.weight"), quant(p + "mlp.up_proj.weight")],
                                         f"{p}gate_up")
        qkv_bias, qk_norm, o_bias = _attention_vectors(args, tensors, a, vec, out, single)
        layers.append(
            LayerWeights(  # each matrix in the layout the few-row kernels stream (block_repack.py)
                qkv=fast(qkv.with_gain(gain(p + "input_layernorm.weight"))),
                qkv_bias=qkv_bias,
                qk_norm=qk_norm,
                o_proj=fast(quant(a + "o_proj.weight")),
                o_bias=o_bias,
                gate_up=fast(gate_up.with_gain(gain(p + ffn_norm_name(args) + ".weight"))),
                down=fast(quant(p + "mlp.down_proj.weight")),
                **_sandwich(args, p, gain, out),
            )
        )
    return ModelWeights(
        embed=plain(tensors["model.embed_tokens.weight"]),
        layers=tuple(layers),
        norm=out(gain("model.norm.weight")),
        lm_head=None if args.tie_word_embeddings else plain(tensors["lm_head.weight"]),
    )


def prepare_weights(
    args: ModelArgs,
    tensors: Mapping[str, Matrix],
    dtype: torch.dtype,
    device: torch.device | str,
    shard: ShardPlan | None = None,
    quant_activations: str = "float32",
    int8_weights: bool = False,
) -> ModelWeights:
    """Validate, fuse, permute and fold in float32, then convert to ``dtype`` on ``device`` (so each
    weight is rounded once). Returns contiguous tensors. With a tensor-parallel ``shard``, only the
    rank's slices (model/parallel.py); the default one-rank plan slices nothing. ``quant_activations``: the
    inputs of block-quantized products (tandem.quantization). ``int8_weights`` (``quantization="int8"``):
    each layer matrix, folded in float32, rounded to int8 with a scale per output feature (model/quant.py);
    the embedding and LM head stay in ``dtype``."""
    validate(args, tensors)
    if int8_weights and (torch.device(device).type != "cpu" or dtype != torch.float32 or
                         (shard is not None and shard.world_size > 1)):
        raise ValueError("weight-only int8 (quantization 'int8') runs on one CPU rank in float32")
    if any(isinstance(t, BlockQuantWeight) for t in tensors.values()):
        if shard is not None and shard.world_size > 1:
            raise ValueError("block-quantized weights (quantization 'gguf') run on one rank; "
                             "use quantization 'none' with tensor_parallel_size > 1")
        if torch.device(device).type != "cpu" or dtype != torch.float32:
            raise ValueError("block-quantized weights (quantization 'gguf') run on the CPU in float32")
        return _quantized_weights(args, tensors, device, dtype, quant_activations)
    heads, kv_heads, hd = args.num_attention_heads, args.num_key_value_heads, args.head_dim
    s = shard if shard is not None else ShardPlan.single(args)
    qs, kvs, fs = s.q_rows(hd), s.kv_rows(hd), s.ffn_rows

    def get(name: str) -> torch.Tensor:
        return tensors[name].to(device=device, dtype=torch.float32)  # type: ignore[union-attr]

    def out(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).contiguous()

    def gain(name: str) -> torch.Tensor:
        """An RMSNorm gain times sqrt(hidden) (see ``unit_rms``)."""
        return (get(name) + args.norm_offset) * args.hidden_size**0.5

    def mat(t: torch.Tensor) -> torch.Tensor | Int8Weight:
        return Int8Weight.quantize(t) if int8_weights else out(t)

    layers = []
    for i in range(args.num_hidden_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        q = interleave_heads(get(a + "q_proj.weight"), heads, hd)[qs]
        k = interleave_heads(get(a + "k_proj.weight"), kv_heads, hd)[kvs]
        qkv = torch.cat([q, k, get(a + "v_proj.weight")[kvs]]) * gain(p + "input_layernorm.weight")
        gate_up = torch.cat([get(p + "mlp.gate_proj.weight")[fs], get(p + "mlp.up_proj.weight")[fs]])
        qkv_bias, qk_norm, o_bias = _attention_vectors(args, tensors, a, get, out, s)
        layers.append(
            LayerWeights(
                qkv=mat(qkv),
                qkv_bias=qkv_bias,
                qk_norm=qk_norm,
                o_proj=mat(get(a + "o_proj.weight")[:, qs]),
                o_bias=o_bias,
                gate_up=mat(gate_up * gain(p + ffn_norm_name(args) + ".weight")),
                down=mat(get(p + "mlp.down_proj.weight")[:, fs]),
                **_sandwich(args, p, gain, out),
            )
        )
    return ModelWeights(
        embed=out(get("model.embed_tokens.weight")[s.vocab_rows]),
        layers=tuple(layers),
        norm=out(gain("model.norm.weight")),
        lm_head=None if args.tie_word_embeddings else out(get("lm_head.weight")[s.vocab_rows]),
    )
