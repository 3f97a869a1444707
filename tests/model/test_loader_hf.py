"""Loading tiny random Hugging Face checkpoints written by transformers' ``save_pretrained``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from tandem.model.loader import load_checkpoint, load_tokenizer
from tandem.model.model_args import ModelArgs

transformers = pytest.importorskip("transformers")

SPECIALS = ["<s>", "</s>", "<pad>"]
VOCAB = 256 + 2 + len(SPECIALS)  # byte alphabet + two merges + specials
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"


def write_tiny_tokenizer(directory: Path, **config: Any) -> None:
    """A byte-level BPE over the 256-byte alphabet with two merges and three special tokens."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab |= {"Ġt": 256, "he": 257}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t"), ("h", "e")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(str(directory / "tokenizer.json"))
    settings = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"} | config
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))


def tiny_config(family: str, **overrides: Any) -> Any:
    common = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "bos_token_id": 258,
        "eos_token_id": 259,
    }
    if family == "llama":
        config = transformers.LlamaConfig(**common, rope_theta=50000.0)
    elif family == "qwen2":
        config = transformers.Qwen2Config(**common)
    else:  # qwen3: head_dim deliberately not hidden / heads
        config = transformers.Qwen3Config(**common, head_dim=16, tie_word_embeddings=True)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def save_tiny(
    tmp_path: Path, family: str, shard: bool = False, **overrides: Any
) -> tuple[Path, Any]:
    torch.manual_seed(0)
    cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
    }[family]
    model = cls(tiny_config(family, **overrides)).eval()
    # Norm weights start at 1; randomise them so a swapped norm cannot pass unnoticed.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_()
    directory = tmp_path / family
    model.save_pretrained(directory, max_shard_size="20KB" if shard else "1GB")
    write_tiny_tokenizer(directory)
    return directory, model


def single_file(directory: Path) -> Path:
    return directory / "model.safetensors"


@pytest.mark.parametrize("shard", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_tensors_equal_transformers_state_dict(tmp_path: Path, family: str, shard: bool) -> None:
    directory, model = save_tiny(tmp_path, family, shard)
    assert (directory / "model.safetensors.index.json").exists() == shard
    ckpt = load_checkpoint(directory)
    state = model.state_dict()
    if ckpt.args.tie_word_embeddings:
        state.pop("lm_head.weight")
    assert set(ckpt.tensors) == set(state)
    for name, tensor in state.items():
        assert ckpt.tensors[name].dtype == torch.float32
        assert torch.equal(ckpt.tensors[name], tensor), name
    args = ckpt.args
    assert (args.family, args.num_hidden_layers, args.hidden_size) == (family, 2, 32)
    assert args.head_dim == (16 if family == "qwen3" else 8)
    assert args.attention_bias == (family == "qwen2")
    assert args.qk_norm == (family == "qwen3")
    assert args.tie_word_embeddings == (family == "qwen3")
    assert args.rope_theta == (
        50000.0 if family == "llama" else model.config.rope_parameters["rope_theta"]
    )
    assert ckpt.source == directory.resolve()
    assert 259 in args.eos_token_ids and ckpt.tokenizer.eos_token_ids >= {259}


def test_dtype_cast_and_file_hash(tmp_path: Path) -> None:
    directory, model = save_tiny(tmp_path, "llama", shard=True)
    ckpt = load_checkpoint(directory, dtype=torch.bfloat16)
    for name, tensor in model.state_dict().items():
        assert torch.equal(ckpt.tensors[name], tensor.to(torch.bfloat16)), name
    digest = hashlib.sha256()
    for shard in sorted(directory.glob("*.safetensors")):
        digest.update(shard.read_bytes())
    assert ckpt.file_sha256() == digest.hexdigest()
    with pytest.raises(ValueError, match="floating-point"):
        load_checkpoint(directory, dtype=torch.int32)


def test_num_layers_leaves_the_later_layers_unread(tmp_path: Path) -> None:
    directory, model = save_tiny(tmp_path, "qwen2", shard=True)
    ckpt = load_checkpoint(directory, num_layers=1)
    state = model.state_dict()
    kept = {n for n in state if not n.startswith("model.layers.") or n.startswith("model.layers.0.")}
    assert set(ckpt.tensors) == kept and kept < set(state)
    assert all(torch.equal(ckpt.tensors[n], state[n]) for n in kept)
    assert ckpt.args.num_hidden_layers == 2


def test_missing_tensor_names_file_and_tensor(tmp_path: Path) -> None:
    directory, _ = save_tiny(tmp_path, "llama")
    tensors = load_file(single_file(directory))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, single_file(directory))
    with pytest.raises(ValueError, match=r"model\.safetensors.*model\.layers\.1\.mlp\.up_proj"):
        load_checkpoint(directory)


def test_wrong_shape_names_file_and_tensor(tmp_path: Path) -> None:
    directory, _ = save_tiny(tmp_path, "qwen2")
    tensors = load_file(single_file(directory))
    tensors["model.layers.0.self_attn.k_proj.bias"] = torch.zeros(7)
    save_file(tensors, single_file(directory))
    with pytest.raises(ValueError, match=r"k_proj\.bias.*\(7,\).*expected \(16,\)"):
        load_checkpoint(directory)


def test_unexpected_tensor_is_rejected_but_tied_lm_head_tolerated(tmp_path: Path) -> None:
    directory, model = save_tiny(tmp_path, "qwen3")
    tensors = load_file(single_file(directory))
    tensors["lm_head.weight"] = model.lm_head.weight.detach().clone()
    save_file(tensors, single_file(directory))
    assert "lm_head.weight" not in load_checkpoint(directory).tensors
    tensors["model.layers.0.mlp.gate_proj.bias"] = torch.zeros(48)
    save_file(tensors, single_file(directory))
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.mlp\.gate_proj"):
        load_checkpoint(directory)


def test_unknown_architecture_names_field_and_value(tmp_path: Path) -> None:
    directory, _ = save_tiny(tmp_path, "llama")
    config = json.loads((directory / "config.json").read_text())
    config["architectures"], config["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json.*architectures.*GPT2LMHeadModel"):
        load_checkpoint(directory)


def test_generation_config_eos_ids_are_merged(tmp_path: Path) -> None:
    directory, _ = save_tiny(tmp_path, "llama")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [259, 260]}))
    ckpt = load_checkpoint(directory)
    assert ckpt.args.eos_token_ids == (259, 260)
    assert ckpt.tokenizer.eos_token_ids == {259, 260}
    assert ckpt.tokenizer.eos_token_id == 259


def test_rope_settings_old_and_new_style() -> None:
    base = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
    }
    scaling = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    old = ModelArgs.from_hf_config(base | {"rope_theta": 5e5, "rope_scaling": scaling})
    new = ModelArgs.from_hf_config(base | {"rope_parameters": scaling | {"rope_theta": 5e5}})
    plain = ModelArgs.from_hf_config(
        base | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    )
    assert old.rope_theta == new.rope_theta == 5e5
    assert old.rope_scaling == new.rope_scaling == scaling
    assert plain.rope_scaling is None and plain.rope_theta == 1e4


def test_hf_tokenizer_flags_and_template(tmp_path: Path) -> None:
    write_tiny_tokenizer(tmp_path, add_bos_token=True, chat_template=TEMPLATE)
    tok = load_tokenizer(tmp_path)  # the tokenizer alone needs no config.json
    ids = tok.encode(" the")
    assert ids[0] == 258 and tok.decode(ids) == " the"
    assert tok.encode(" the", add_special_tokens=False) == ids[1:]
    assert tok.convert_ids_to_tokens(ids[1:]) == ["Ġt", "he"]
    assert tok.token_bytes(256) == b" t" and tok.token_bytes(259) == b"</s>"
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (258, 259, 260)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs) == "<user>hi</s>"
    # chat_template.jinja (transformers >= 4.50 layout) wins over tokenizer_config.json.
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}")
    assert load_tokenizer(tmp_path).apply_chat_template(msgs) == "<s>hi"
