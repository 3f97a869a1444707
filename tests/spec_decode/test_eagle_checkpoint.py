"""Draft heads from the public layouts: sharing rules (same storage, not copies), own tensors when present,
the writer round-trip, and the clear construction errors of heads that do not fit their target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.config import SpeculativeConfig
from tandem.model.loader import load_checkpoint
from tandem.model.quant import Int8Weight
from tandem.model.transformer import CausalLM
from tandem.spec_decode.eagle import DraftHeadProposer
from tandem.spec_decode.eagle_checkpoint import HeadConfig, expected_shapes, load_eagle_head
from tandem.spec_decode.head_writer import save_eagle_head
from tandem.spec_decode.factory import build_proposer
from tests.spec_decode.tiny_heads import H, add_mtp, tiny_target, write_eagle, write_eagle3

V = 261


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, CausalLM]:
    directory = tiny_target(tmp_path_factory.mktemp("t"))
    ckpt = load_checkpoint(directory)
    return directory, ckpt, CausalLM.from_tensors(ckpt.args, ckpt.tensors)


def _build(target: tuple[Path, Any, CausalLM], **spec: Any) -> DraftHeadProposer:
    _, ckpt, model = target
    config = SpeculativeConfig(num_speculative_tokens=3, **spec)
    proposer = build_proposer(config, target=model, target_checkpoint=ckpt, num_kv_blocks=8, block_size=16)
    assert isinstance(proposer, DraftHeadProposer)
    return proposer


def _same_storage(a: torch.Tensor | Int8Weight, b: torch.Tensor) -> bool:
    if isinstance(a, Int8Weight):
        a = a.q  # a quantized copy: never the target's storage
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _is_rounding_of(w: torch.Tensor | Int8Weight, want: torch.Tensor) -> bool:
    """``w`` holds ``want`` in the drafter's weight dtype: exactly its bf16 / float32 rounding, or int8
    within half a step of each row's scale (the CPU default)."""
    if isinstance(w, Int8Weight):
        return bool(((w.dequantize() - want.float()).abs() <= w.scale.unsqueeze(1) / 2 + 1e-6).all())
    return torch.equal(w, want.to(w.dtype))


def test_eagle_without_embedding_and_head_shares_the_targets(target: Any, tmp_path: Path) -> None:
    model = target[2]
    head = _build(target, method="eagle", model=str(write_eagle(tmp_path / "e", V))).head
    assert head.embed is model.embed_tokens
    assert _same_storage(head.lm_head, model.lm_head)


def test_eagle_identical_copies_are_shared_different_ones_are_own(target: Any, tmp_path: Path) -> None:
    model = target[2]
    embed, lm_head = model.embed_tokens.detach().clone(), model.lm_head.detach().clone()
    same = _build(target, method="eagle",
                  model=str(write_eagle(tmp_path / "same", V, embed=embed, lm_head=lm_head))).head
    assert same.embed is model.embed_tokens and _same_storage(same.lm_head, model.lm_head)
    own_embed, own_head = embed + 1.0, lm_head * 2.0
    own = _build(target, method="eagle",
                 model=str(write_eagle(tmp_path / "own", V, embed=own_embed, lm_head=own_head))).head
    assert not _same_storage(own.embed, model.embed_tokens)
    assert not _same_storage(own.lm_head, model.lm_head)
    # The head's own LM head is its own tensor, in the drafter's weight dtype (int8 by default on the CPU).
    assert torch.equal(own.embed, own_embed) and _is_rounding_of(own.lm_head, own_head)
    exact = _build(target, method="eagle", draft_dtype="float32",
                   model=str(tmp_path / "own")).head
    assert exact.lm_head.dtype == torch.float32 and torch.equal(exact.lm_head, own_head)


def test_eagle3_own_draft_head_and_map(target: Any, tmp_path: Path) -> None:
    model = target[2]
    d2t = torch.arange(100)  # draft id i -> target id 2i
    path = write_eagle3(tmp_path / "e3", V, 100, d2t=d2t, layer_ids=[1, 2, 3])
    p = _build(target, method="eagle3", model=str(path))
    own = load_file(str(path / "model.safetensors"))["lm_head.weight"]
    assert _is_rounding_of(p.head.lm_head, own)
    assert not _same_storage(p.head.lm_head, model.lm_head)
    assert p.head.embed is model.embed_tokens  # no embedding in the checkpoint
    assert torch.equal(p.head.draft_map, 2 * torch.arange(100))
    assert p.aux_hidden_layers == (0, 1, 2)  # vLLM ids 1..3 -> outputs of layers 0..2
    # Without its own head and map: a leading slice of the target's head, as a view.
    p2 = _build(target, method="eagle3", model=str(write_eagle3(tmp_path / "e3b", V, 100, own_head=False)))
    assert p2.head.draft_map is None and _same_storage(p2.head.lm_head, model.lm_head)
    assert p2.head.lm_head.shape == (100, H)
    assert p2.aux_hidden_layers == (1, 1, 0)  # default (2, L // 2, L - 3) for L = 4, minus one


def test_mtp_always_uses_the_targets_tensors(tmp_path: Path) -> None:
    directory = add_mtp(tiny_target(tmp_path), copies=True)  # the copies differ from the target (+1)
    ckpt = load_checkpoint(directory)
    model = CausalLM.from_tensors(ckpt.args, ckpt.tensors)
    head = _build((directory, ckpt, model), method="mtp").head
    assert head.embed is model.embed_tokens
    assert _same_storage(head.lm_head, model.lm_head)


def test_eagle_draft_vocabulary_map_over_the_targets_head(target: Any, tmp_path: Path) -> None:
    """An EAGLE head without its own LM head but with ``d2t`` (what train-drafter writes by default): the
    target's rows of the mapped ids, gathered once; the embedding stays the target's tensor."""
    model = target[2]
    path = write_eagle(tmp_path / "e", V, draft_vocab_size=50)
    tensors = load_file(str(path / "model.safetensors"))
    ids = torch.arange(200, 250)
    tensors["d2t"] = ids - torch.arange(50)
    save_file(tensors, str(path / "model.safetensors"))
    for dtype in ("float32", "bfloat16"):
        head = _build(target, method="eagle", model=str(path), draft_dtype=dtype).head
        assert head.embed is model.embed_tokens and torch.equal(head.draft_map, ids)
        assert head.lm_head.dtype == getattr(torch, dtype)
        assert torch.equal(head.lm_head, model.lm_head[ids].to(head.lm_head.dtype))


def test_mtp_draft_vocabulary_map_gathers_the_targets_rows(tmp_path: Path) -> None:
    """``model.layers.{L}.d2t`` (tandem's addition to the DeepSeek-V3 names): the draft LM head is the
    target's rows of the mapped ids (a scattered subset cannot be a view), the embedding still the target's
    very tensor; the copies the checkpoint holds stay ignored."""
    directory = add_mtp(tiny_target(tmp_path), copies=True)
    ids = torch.arange(0, 2 * 60, 2)  # 60 draft ids
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["model.layers.4.d2t"] = ids - torch.arange(60)
    save_file(tensors, str(directory / "model.safetensors"))
    config = json.loads((directory / "config.json").read_text()) | {"mtp_draft_vocab_size": 60}
    (directory / "config.json").write_text(json.dumps(config))
    ckpt = load_checkpoint(directory)
    model = CausalLM.from_tensors(ckpt.args, ckpt.tensors)
    for dtype in ("float32", "auto"):
        head = _build((directory, ckpt, model), method="mtp", draft_dtype=dtype).head
        assert head.embed is model.embed_tokens
        assert torch.equal(head.draft_map, ids)
        # the target's rows of the draft ids, gathered (a copy) and then in the drafter's weight dtype
        assert _is_rounding_of(head.lm_head, model.lm_head[ids])
        assert not _same_storage(head.lm_head, model.lm_head)


def test_writer_round_trip_in_the_public_layout(target: Any, tmp_path: Path) -> None:
    src = write_eagle3(tmp_path / "src", V, 100, d2t=torch.arange(100), layer_ids=[1, 2, 3])
    cfg, tensors = load_eagle_head(src, "eagle3", 4)
    out = save_eagle_head(tmp_path / "out", cfg, tensors, torch.float32)
    names = set(load_file(str(out / "model.safetensors")))
    assert "midlayer.self_attn.q_proj.weight" in names and {"fc.weight", "d2t", "t2d"} <= names
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    cfg2, tensors2 = load_eagle_head(out, "eagle3", 4)
    assert cfg2 == cfg and all(torch.equal(tensors[n], tensors2[n]) for n in tensors)
    # The EAGLE-1 prefix ``model.`` is accepted too.
    _build(target, method="eagle", model=str(write_eagle(tmp_path / "pre", V, prefix="model.")))


# -- bad input: clear errors at construction ---------------------------------------------------------
def test_head_with_wrong_hidden_size(target: Any, tmp_path: Path) -> None:
    cfg = HeadConfig("eagle", hidden_size=64, intermediate_size=48, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=V, draft_vocab_size=V)
    required, _ = expected_shapes(cfg)
    path = save_eagle_head(tmp_path / "e", cfg, {n: torch.ones(s) for n, s in required.items()})
    with pytest.raises(ValueError, match="hidden size 64, the target 32"):
        _build(target, method="eagle", model=str(path))


def test_head_with_wrong_vocabulary(target: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="vocabulary of 300 tokens, the target 261"):
        _build(target, method="eagle", model=str(write_eagle(tmp_path / "e", 300)))


def test_eagle3_layer_ids_out_of_range(target: Any, tmp_path: Path) -> None:
    path = write_eagle3(tmp_path / "e3", V, 100, layer_ids=[1, 2, 4])
    with pytest.raises(ValueError, match=r"\[4\] outside \[1, 3\]"):
        _build(target, method="eagle3", model=str(path))
    ok = write_eagle3(tmp_path / "ok", V, 100, layer_ids=[1, 2, 3])
    with pytest.raises(ValueError, match="outside"):
        _build(target, method="eagle3", model=str(ok), eagle3_layer_ids=(0, 1, 2))
    with pytest.raises(ValueError, match="applies to method 'eagle3' only"):
        _build(target, method="eagle", model=str(write_eagle(tmp_path / "e", V)), eagle3_layer_ids=(1,))


def test_mtp_on_a_target_without_mtp_weights(target: Any) -> None:
    with pytest.raises(ValueError, match="has no MTP weights"):
        _build(target, method="mtp")


def test_head_missing_a_tensor_or_wrong_shape(target: Any, tmp_path: Path) -> None:
    path = write_eagle(tmp_path / "e", V)
    tensors = load_file(str(path / "model.safetensors"))
    save_file({n: t for n, t in tensors.items() if n != "fc.weight"}, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="missing tensor 'fc.weight'"):
        _build(target, method="eagle", model=str(path))
    tensors["fc.weight"] = torch.zeros(H, 3 * H)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"'fc.weight' has shape \(32, 96\), expected \(32, 64\)"):
        _build(target, method="eagle", model=str(path))


def test_no_shipped_head_for_an_unknown_target(target: Any) -> None:
    with pytest.raises(ValueError, match="no head is shipped"):
        _build(target, method="eagle")
