"""Grammar compilation and matching on a tiny byte vocabulary and on the real tokenizer: bad
constraints are a ValueError naming ``structured_outputs``, compiled grammars are cached by spec,
verify-row masks follow the draft prefix and leave the matcher at the committed state, invalid
drafts are cut, and a request rebuilt after preemption has the same grammar state."""

from __future__ import annotations

import json

import pytest
import torch

from tandem.sampling_params import SamplingParams, StructuredOutputsParams
from tandem.structured.bitmask import (
    allocate_bitmask,
    apply_bitmask,
    build_verify_masks,
    fill_verify_rows,
    unpack_bitmask,
)
from tandem.structured.grammar import (
    RequestGrammar,
    build_grammar,
    check_structured_outputs,
    spec_key,
)
from tandem.structured.manager import StructuredOutputManager

pytest.importorskip("xgrammar")

# token ids:  0    1    2    3    4    5      6 (EOS, special)   7..39 padding
_BYTES = [b"a", b"b", b"c", b"d", b"x", b"ab", b""]
EOS = 6
V = 40


class _TinyTokenizer:
    vocab_size = len(_BYTES)
    all_special_ids = (EOS,)

    def token_bytes(self, i: int) -> bytes:
        return _BYTES[i]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [_BYTES.index(c.encode()) for c in text]


def _manager() -> StructuredOutputManager:
    return StructuredOutputManager(_TinyTokenizer, V, [EOS])  # type: ignore[arg-type,return-value]


def _regex(r: str) -> SamplingParams:
    return SamplingParams(structured_outputs=StructuredOutputsParams(regex=r))


def _allowed(bitmask: torch.Tensor, row: int) -> list[int]:
    return unpack_bitmask(bitmask[row : row + 1], V)[0].nonzero().flatten().tolist()


@pytest.mark.parametrize(
    "params",
    [
        StructuredOutputsParams(json={"type": "objectx"}),
        StructuredOutputsParams(json="{not json"),
        StructuredOutputsParams(regex="(ab"),
        StructuredOutputsParams(grammar="root ::= undefined_rule"),
    ],
)
def test_bad_constraints_are_value_errors(params: StructuredOutputsParams) -> None:
    with pytest.raises(ValueError, match=r"^structured_outputs: "):
        check_structured_outputs(params)


def test_good_constraints_build() -> None:
    for params in (
        StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}}),
        StructuredOutputsParams(json_object=True),
        StructuredOutputsParams(regex="[0-9]+"),
        StructuredOutputsParams(choice=('say "hi"', "back\\slash", "é")),
        StructuredOutputsParams(grammar='root ::= "yes" | "no"'),
    ):
        build_grammar(params)


def test_spec_key_keeps_property_order_and_compiles_once() -> None:
    a = StructuredOutputsParams(json={"type": "object", "properties": {"b": {}, "a": {}}})
    b = StructuredOutputsParams(json='{"type": "object", "properties": {"b": {}, "a": {}}}')
    c = StructuredOutputsParams(json={"type": "object", "properties": {"a": {}, "b": {}}})
    assert spec_key(a) == spec_key(b) != spec_key(c)  # xgrammar emits properties in this order
    m = _manager()
    c1 = m.compiler.compile(StructuredOutputsParams(regex="ab"))
    c2 = m.compiler.compile(StructuredOutputsParams(regex="ab"))
    assert c1 is c2 and m.compiler.num_compiled == 1


def test_verify_rows_follow_draft_prefix_and_roll_back() -> None:
    m = _manager()
    g = RequestGrammar("r", m.compiler.compile(StructuredOutputsParams(regex="ab(c|d)")))
    bm = allocate_bitmask(4, V)
    n = fill_verify_rows(g, [0, 1, 2], bm, 0)
    assert n == 3
    assert _allowed(bm, 0) == [0, 5]  # "a" or "ab"
    assert _allowed(bm, 1) == [1]
    assert _allowed(bm, 2) == [2, 3]
    assert _allowed(bm, 3) == [EOS]  # complete: only the stop token
    # Back at the committed (empty) state: the same first mask again.
    bm2 = allocate_bitmask(1, V)
    assert fill_verify_rows(g, [], bm2, 0) == 0
    assert _allowed(bm2, 0) == [0, 5]


def test_invalid_draft_cuts_the_rest() -> None:
    m = _manager()
    g = RequestGrammar("r", m.compiler.compile(StructuredOutputsParams(regex="ab(c|d)")))
    bm = allocate_bitmask(4, V)
    assert fill_verify_rows(g, [0, 4, 1], bm, 0) == 1  # "x" is not allowed after "a"
    assert _allowed(bm, 3) == list(range(V))  # rows past the cut stay open
    g.accept_committed([5])  # committed "ab": the matcher was back at the start
    bm2 = allocate_bitmask(1, V)
    fill_verify_rows(g, [], bm2, 0)
    assert _allowed(bm2, 0) == [2, 3]


def test_draft_stop_token_ends_the_check() -> None:
    m = _manager()
    g = RequestGrammar("r", m.compiler.compile(StructuredOutputsParams(regex="ab")))
    bm = allocate_bitmask(4, V)
    assert fill_verify_rows(g, [5, EOS, 0], bm, 0) == 2
    assert _allowed(bm, 1) == [EOS]
    assert not g.terminated  # rolled back


def test_committed_tokens_after_stop_are_ignored_and_bad_ones_drop_the_constraint() -> None:
    m = _manager()
    g = RequestGrammar("r", m.compiler.compile(StructuredOutputsParams(regex="ab")))
    g.accept_committed([5, EOS, 0, 1])
    assert g.terminated and not g.failed and not g.active
    g2 = RequestGrammar("r2", m.compiler.compile(StructuredOutputsParams(regex="ab")))
    g2.accept_committed([4])
    assert g2.failed and not g2.active


def test_batch_masks_mixed_requests() -> None:
    m = _manager()
    m.add_request("c", _regex("ab(c|d)"), [])
    m.add_request("free", SamplingParams(), [])  # no grammar
    masks = m.verify_masks(["free", "c"], [[4, 4], [0, 4]], [3, 3])
    assert masks.num_valid == [2, 1]
    assert masks.rows == [3, 4]
    logits = torch.zeros(6, V)
    apply_bitmask(logits, masks.bitmask, masks.rows)
    assert torch.isfinite(logits[:3]).all() and torch.isfinite(logits[5]).all()
    assert torch.isfinite(logits[3]).nonzero().flatten().tolist() == [0, 5]
    assert torch.isfinite(logits[4]).nonzero().flatten().tolist() == [1]
    none = build_verify_masks([None], [[1, 2]], [3], V)
    assert none.bitmask is None and none.num_valid == [2]


def test_resume_after_preemption_rebuilds_the_same_state() -> None:
    m = _manager()
    params = _regex("(ab|c)+d")
    m.add_request("r", params, [])
    for tok in ([5], [2], [0, 1]):
        m.accept("r", tok)
    bm_live = allocate_bitmask(1, V)
    fill_verify_rows(m.grammars["r"], [], bm_live, 0)
    m.remove_requests(["r"])  # preempted: the runner drops the state
    assert "r" not in m.grammars
    m.add_request("r", params, [5, 2, 0, 1])  # resumed with its committed outputs
    bm_resumed = allocate_bitmask(1, V)
    fill_verify_rows(m.grammars["r"], [], bm_resumed, 0)
    assert torch.equal(bm_live, bm_resumed)
    assert _allowed(bm_resumed, 0) == [0, 2, 3, 5]


def test_real_tokenizer_json_schema() -> None:
    from tandem.model.loader import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    eos = sorted(tok.eos_token_ids)
    m = StructuredOutputManager(lambda: tok, tok.vocab_size, eos)
    schema = {
        "type": "object",
        # not alphabetical: properties come out in the schema's order
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}},
            "name": {"type": "string"},
        },
        "required": ["name", "tags"],
    }
    m.add_request("r", SamplingParams(structured_outputs={"json": schema}), [])
    text = json.dumps({"tags": ["x", "y"], "name": "bob"})
    ids = tok.encode(text, add_special_tokens=False)
    bm = allocate_bitmask(len(ids) + 1, tok.vocab_size)
    g = m.grammars["r"]
    assert fill_verify_rows(g, ids, bm, 0) == len(ids)
    allowed = unpack_bitmask(bm, tok.vocab_size)
    for j, t in enumerate(ids):
        assert allowed[j, t], f"token {j} ({tok.token_bytes(t)!r}) masked"
        assert not allowed[j, eos].any() or j == len(ids)
    assert allowed[len(ids), eos].all()  # the object is complete: EOS allowed
    specials = [i for i in tok.all_special_ids if i not in eos]
    assert not allowed[:, specials].any()
    # A draft that breaks the schema is cut where it breaks.
    bad = tok.encode('{"name": "bob", "tags": []}', add_special_tokens=False)
    n = fill_verify_rows(g, bad, allocate_bitmask(len(bad) + 1, tok.vocab_size), 0)
    assert 0 < n < len(bad)


def test_json_object_is_an_object_and_special_drafts_are_cut_quietly(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from tandem.model.loader import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    m = StructuredOutputManager(lambda: tok, tok.vocab_size, sorted(tok.eos_token_ids))
    m.add_request("r", SamplingParams(structured_outputs={"json_object": True}), [])
    bm = allocate_bitmask(1, tok.vocab_size)
    assert fill_verify_rows(m.grammars["r"], [], bm, 0) == 0
    allowed = unpack_bitmask(bm, tok.vocab_size)[0]
    (brace,) = tok.encode("{", add_special_tokens=False)
    (bracket,) = tok.encode("[", add_special_tokens=False)
    assert allowed[brace] and not allowed[bracket]  # OpenAI's json_object: an object, not any value
    special = next(i for i in tok.all_special_ids if i not in tok.eos_token_ids)
    bm4 = allocate_bitmask(4, tok.vocab_size)
    assert fill_verify_rows(m.grammars["r"], [brace, special, brace], bm4, 0) == 1
    assert "cannot accept" not in capfd.readouterr().err
