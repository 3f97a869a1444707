"""The tensors a checkpoint must hold for a given ``ModelArgs``, by Hugging Face name and shape.

Both loaders check a file against this list *before* reading any weights, so a missing, extra or
wrong-shaped tensor is reported with the file and tensor name instead of surfacing later as a
shape error deep in the model (and tandem never falls back to random weights).

Per family (``H`` hidden, ``I`` intermediate, ``q = heads * head_dim``,
``kv = kv_heads * head_dim``):

- all: ``model.embed_tokens.weight [V, H]``, ``model.norm.weight [H]``, ``lm_head.weight [V, H]``
  unless the embeddings are tied; per layer ``self_attn.{q,k,v,o}_proj.weight``,
  ``mlp.{gate,up,down}_proj.weight``, ``input_layernorm.weight``,
  ``post_attention_layernorm.weight``.
- ``attention_bias`` (qwen2): ``self_attn.{q,k,v}_proj.bias``.
- ``qk_norm`` (qwen3, gemma3): ``self_attn.{q,k}_norm.weight [head_dim]``.
- ``sandwich_norms`` (gemma3): ``pre_feedforward_layernorm.weight`` and ``post_feedforward_layernorm.weight``
  ``[H]`` (there ``post_attention_layernorm`` normalizes the attention output, not the MLP input).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tandem.model.model_args import ModelArgs

Shape = tuple[int, ...]

# Buffers some older checkpoints carry that are recomputed at load time rather than read.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def expected_tensors(args: ModelArgs) -> dict[str, Shape]:
    """Every tensor tandem needs for ``args``, with its row-major shape."""
    h, i, d = args.hidden_size, args.intermediate_size, args.head_dim
    q, kv = args.num_attention_heads * d, args.num_key_value_heads * d
    shapes: dict[str, Shape] = {
        "model.embed_tokens.weight": (args.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not args.tie_word_embeddings:
        shapes["lm_head.weight"] = (args.vocab_size, h)
    for layer in range(args.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
        if args.attention_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.bias": (kv,),
            }
        if args.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        if args.sandwich_norms:
            shapes |= {p + "pre_feedforward_layernorm.weight": (h,), p + "post_feedforward_layernorm.weight": (h,)}
    return shapes


def is_ignored(name: str) -> bool:
    return name.endswith(_IGNORED_SUFFIXES)


def in_layers(name: str, num_layers: int | None) -> bool:
    """Whether the HF tensor ``name`` is read when only the first ``num_layers`` decoder layers are (None: all)."""
    if num_layers is None or not name.startswith("model.layers."):
        return True
    return int(name.split(".")[2]) < num_layers


def check_tensors(
    found: Mapping[str, Shape],
    args: ModelArgs,
    source: object,
    *,
    optional: Iterable[str] = (),
) -> None:
    """Raise ``ValueError`` naming ``source`` and the tensor if ``found`` (HF name -> shape) does
    not match ``expected_tensors(args)``. Names in ``optional`` may be present but are not used
    (e.g. a tied checkpoint that still stores ``lm_head.weight``)."""
    expected = expected_tensors(args)
    missing = [name for name in expected if name not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(
            f"{source}: missing tensor {missing[0]!r}{more} required by the {args.family} "
            f"config ({args.num_hidden_layers} layers)"
        )
    allowed = set(optional)
    for name, shape in found.items():
        want = expected.get(name)
        if want is None:
            if name in allowed or is_ignored(name):
                continue
            raise ValueError(
                f"{source}: unexpected tensor {name!r} with shape {tuple(shape)}, which the "
                f"{args.family} config does not use"
            )
        if tuple(shape) != want:
            raise ValueError(
                f"{source}: tensor {name!r} has shape {tuple(shape)}, expected {want} "
                f"for the {args.family} config"
            )
