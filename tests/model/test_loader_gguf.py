"""Round trip: tiny random transformers models written to GGUF with ``gguf.GGUFWriter`` the way
llama.cpp's converter does (renamed tensors, Q/K rows permuted for llama, some tensors Q8_0) must
load back to the original Hugging Face tensors."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tokenizers import pre_tokenizers

from tandem.model.loader import UnsupportedQuantError, load_checkpoint, load_tokenizer
from tandem.model.loader.gguf_file import GGUFFile
from tests.quant_blocks import random_blocks

# Types written as random blocks (the written HF tensor is then not what the file holds).
RANDOM_BLOCK_TYPES = (Q.Q2_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)

transformers = pytest.importorskip("transformers")

TOKENS = [*sorted(pre_tokenizers.ByteLevel.alphabet()), "Ġt", "he", "<|im_start|>", "<|im_end|>"]
TYPES = [1] * 258 + [3, 3]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
LAYER_PARTS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GLOBALS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf: str) -> str:
    if hf in GLOBALS:
        return GLOBALS[hf]
    match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf)
    assert match is not None, hf
    layer, part, kind = match.groups()
    return f"blk.{layer}.{LAYER_PARTS[part]}.{kind}"


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's rows from rotate-half order to interleaved pairs."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def tiny_model(family: str, tie: bool) -> Any:
    torch.manual_seed(0)
    common = {
        "vocab_size": len(TOKENS),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": tie,
    }
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif family == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, head_dim=16))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_()
    return model.eval()


def write_gguf(
    path: Path,
    family: str,
    model: Any,
    quant: dict[str, Q] | None = None,
    drop: tuple[str, ...] = (),
    arch: str | None = None,
    extra_kv: dict[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """Write ``model`` as llama.cpp would; return the HF tensors that were written."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    arch = arch or family
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(TOKENS)
    w.add_token_types(TYPES)
    w.add_token_merges(["Ġ t", "h e"])
    w.add_bos_token_id(258)
    w.add_eos_token_id(259)
    w.add_chat_template(TEMPLATE)
    for key, value in (extra_kv or {}).items():
        w.add_string(key, value) if isinstance(value, str) else w.add_float32(key, value)
    state = {k: v for k, v in model.state_dict().items() if k not in drop}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight")
    for hf, tensor in state.items():
        data = tensor.numpy().astype(np.float32)
        if family == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in hf else cfg.num_key_value_heads
            data = llama_cpp_permute(data, heads)
        qtype = (quant or {}).get(hf)
        if qtype is None:
            w.add_tensor(gguf_name(hf), data)
        elif qtype in RANDOM_BLOCK_TYPES:  # gguf-py has no quantizer for these: random blocks
            raw = random_blocks(qtype, data.shape[0], data.shape[1], np.random.default_rng(len(hf)))
            w.add_tensor(gguf_name(hf), raw, raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name(hf), gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return state


@pytest.mark.parametrize(
    "family,tie", [("llama", False), ("llama", True), ("qwen2", False), ("qwen3", True)]
)
def test_f32_round_trip_is_exact(tmp_path: Path, family: str, tie: bool) -> None:
    model = tiny_model(family, tie)
    state = write_gguf(tmp_path / "m.gguf", family, model)
    ckpt = load_checkpoint(tmp_path / "m.gguf")
    assert set(ckpt.tensors) == set(state)
    for name, tensor in state.items():
        assert torch.equal(ckpt.tensors[name], tensor), name
    args, cfg = ckpt.args, model.config
    assert (args.family, args.tie_word_embeddings) == (family, tie)
    assert args.head_dim == (16 if family == "qwen3" else 8)
    assert args.attention_bias == (family == "qwen2") and args.qk_norm == (family == "qwen3")
    assert args.rms_norm_eps == pytest.approx(cfg.rms_norm_eps)
    assert (args.bos_token_id, args.eos_token_ids) == (258, (259,))


def test_num_layers_reads_the_first_layers_and_everything_outside_them(tmp_path: Path) -> None:
    """``load_checkpoint(num_layers=1)`` (make_draft's load): the first layer's tensors and the ones outside
    the layers, equal to the whole load's; the args still the whole model's; a count below 1 refused."""
    state = write_gguf(tmp_path / "m.gguf", "llama", tiny_model("llama", tie=False))
    whole = load_checkpoint(tmp_path / "m.gguf")
    first = load_checkpoint(tmp_path / "m.gguf", num_layers=1)
    kept = {n for n in state if not n.startswith("model.layers.") or n.startswith("model.layers.0.")}
    assert set(first.tensors) == kept and kept < set(state)
    assert all(torch.equal(first.tensors[n], whole.tensors[n]) for n in kept)
    assert first.args == whole.args
    with pytest.raises(ValueError, match="num_layers must be at least 1, got 0"):
        load_checkpoint(tmp_path / "m.gguf", num_layers=0)


def test_q8_0_round_trip_within_quantization_error(tmp_path: Path) -> None:
    model = tiny_model("llama", tie=False)
    quantized = {
        "model.layers.0.self_attn.q_proj.weight": Q.Q8_0,
        "model.layers.1.self_attn.k_proj.weight": Q.Q8_0,
        "model.layers.0.mlp.down_proj.weight": Q.Q8_0,
        "lm_head.weight": Q.Q8_0,
    }
    state = write_gguf(tmp_path / "m.gguf", "llama", model, quant=quantized)
    ckpt = load_checkpoint(tmp_path / "m.gguf", dtype=torch.float32)
    for name, tensor in state.items():
        got = ckpt.tensors[name]
        if name not in quantized:
            assert torch.equal(got, tensor), name
            continue
        # Q8_0 rounds to steps of d = absmax / 127 per 32-block, and d itself is stored as fp16
        # (relative error 2^-11, times |q| <= 127): error <= d * (1/2 + 127/2048).
        blocks = tensor.reshape(-1, 32)
        step = blocks.abs().amax(dim=1, keepdim=True) / 127
        err = (got.reshape(-1, 32) - blocks).abs()
        assert bool((err <= step * (0.5 + 127 / 2048)).all()), name
        assert not torch.equal(got, tensor), name  # it really was quantized
        assert (err.max() / step.max()).item() > 0.25, name


def test_gguf_reader_agrees_with_gguf_package(tmp_path: Path) -> None:
    model = tiny_model("qwen3", tie=True)
    write_gguf(tmp_path / "m.gguf", "qwen3", model, quant={"model.norm.weight": Q.F16})
    ours = GGUFFile.open(tmp_path / "m.gguf")
    ref = gguf.GGUFReader(tmp_path / "m.gguf")
    for key, field in ref.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == pytest.approx(field.contents()), key
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert (
            info.shape == tuple(int(d) for d in reversed(t.shape))
            and info.ggml_type == t.tensor_type
        )
        assert np.array_equal(ours.raw(t.name), np.asarray(t.data).reshape(-1).view(np.uint8))


def test_a_files_header_is_parsed_once_and_again_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_gguf(path, "qwen3", tiny_model("qwen3", tie=True))
    a, b = GGUFFile.open(path), GGUFFile.open(path)
    assert a.metadata is b.metadata and a.tensors is b.tensors  # shared, and read-only
    with pytest.raises(TypeError):
        a.metadata["general.architecture"] = "x"  # type: ignore[index]
    write_gguf(path, "llama", tiny_model("llama", tie=False))  # rewritten in place: another header
    c = GGUFFile.open(path)
    assert c.metadata is not a.metadata and c.require("general.architecture") == "llama"
    assert a.require("general.architecture") == "qwen3"


def test_a_files_tokenizer_backend_is_built_once_and_shared_read_only(tmp_path: Path) -> None:
    """Two tokenizers of one file share the built backend (loader/tokenizer_gguf.py), not the ``Tokenizer``: what
    an engine sets on its own (the chat template) stays its own; a rewritten file gets a backend of its own."""
    path = tmp_path / "m.gguf"
    write_gguf(path, "qwen3", tiny_model("qwen3", tie=True))
    a, b = load_tokenizer(path), load_tokenizer(path)
    assert a is not b and a.backend is b.backend
    assert load_checkpoint(path).tokenizer.backend is a.backend  # the worker's build shares it too
    text = "def f(x):\n    return x  # ok"
    before = b.encode(text)
    a.chat_template = None
    assert b.chat_template is not None and b.encode(text) == before
    write_gguf(path, "llama", tiny_model("llama", tie=False))  # rewritten in place: another file
    c = load_tokenizer(path)
    assert c.backend is not a.backend and c.encode(text) == before


def test_unknown_quant_type_names_tensor_before_reading_weights(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    model = tiny_model("llama", tie=True)
    write_gguf(path, "llama", model, quant={"model.layers.1.mlp.up_proj.weight": Q.Q8_0})
    gf = GGUFFile.open(path)
    info = gf.tensors["blk.1.ffn_up.weight"]
    data = bytearray(path.read_bytes())
    # the type id sits right after the tensor's dims in the header: rewrite it to an unknown id
    name = b"blk.1.ffn_up.weight"
    at = data.index(name) + len(name) + 4 + 8 * len(info.shape)
    assert int.from_bytes(data[at : at + 4], "little") == Q.Q8_0
    data[at : at + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedQuantError, match=r"blk\.1\.ffn_up\.weight.*99"):
        load_checkpoint(path)


def test_missing_tensor_and_unknown_architecture(tmp_path: Path) -> None:
    model = tiny_model("llama", tie=True)
    write_gguf(tmp_path / "a.gguf", "llama", model, drop=("model.layers.1.mlp.up_proj.weight",))
    with pytest.raises(
        ValueError, match=r"a\.gguf.*missing tensor 'model\.layers\.1\.mlp\.up_proj"
    ):
        load_checkpoint(tmp_path / "a.gguf")
    write_gguf(tmp_path / "b.gguf", "llama", model, arch="gemma")
    with pytest.raises(ValueError, match=r"b\.gguf.*general\.architecture 'gemma'"):
        load_checkpoint(tmp_path / "b.gguf")


def test_rope_scaling_metadata(tmp_path: Path) -> None:
    model = tiny_model("llama", tie=True)
    kv = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    write_gguf(tmp_path / "m.gguf", "llama", model, extra_kv=kv)
    args = load_checkpoint(tmp_path / "m.gguf").args
    assert args.rope_scaling == {"rope_type": "linear", "factor": 4.0}


def test_tokenizer_from_gguf_metadata(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf", "llama", tiny_model("llama", tie=True))
    tok = load_tokenizer(tmp_path)  # a directory holding one .gguf resolves to it
    ids = tok.encode("<|im_start|> the<|im_end|>")
    assert tok.convert_ids_to_tokens(ids) == ["<|im_start|>", "Ġt", "he", "<|im_end|>"]
    assert tok.decode(ids) == " the"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|> the<|im_end|>"
    assert tok.all_special_ids == (258, 259)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<|im_start|>x<|im_end|>"
    assert [tok.token_bytes(i) for i in ids] == [b"<|im_start|>", b" t", b"he", b"<|im_end|>"]
    # Picklable (compiled templates are not; they are recompiled), for multi-process use.
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.encode(" the") == tok.encode(" the")
    assert (
        clone.apply_chat_template([{"role": "user", "content": "x"}]) == "<|im_start|>x<|im_end|>"
    )
