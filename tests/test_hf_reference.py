"""tests/hf_reference.py's copy of a GGUF file gives transformers what the original gives it: on the default model,
every metadata field but the ``tokenizer.ggml.*`` arrays equal (read by gguf-py, not by tandem's reader), the
vocabulary size stated, every tensor's name, type, shape and bytes equal, and transformers' config equal; and the
faster gguf-py reader the helpers load with reads every field and tensor as gguf-py's own."""

from __future__ import annotations

import numpy as np
import pytest

from tandem.model.loader import resolve_model
from tests.hf_reference import _faster_gguf, without_vocabulary

pytestmark = pytest.mark.slow
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


def _fields(reader: object) -> dict[str, object]:
    out = {}
    for name, field in reader.fields.items():  # type: ignore[attr-defined]
        if name.startswith("GGUF."):  # the header's own counts, not metadata
            continue
        out[name] = (tuple(field.types), [bytes(np.asarray(field.parts[i]).tobytes()) for i in field.data])
    return out


def test_the_copy_keeps_the_models_fields_and_tensors() -> None:
    src = resolve_model("smollm2-135m-instruct")
    copy = without_vocabulary(src)
    assert without_vocabulary(src) == copy  # written once a session
    original, stripped = gguf.GGUFReader(src), gguf.GGUFReader(copy)
    want, got = _fields(original), _fields(stripped)
    dropped = {k for k, (types, _) in want.items() if k.startswith("tokenizer.ggml.") and types[0] == 9}
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"} <= dropped
    assert got == {k: v for k, v in want.items() if k not in dropped}
    assert int(stripped.fields["llama.vocab_size"].parts[-1][0]) == len(original.fields["tokenizer.ggml.tokens"].data)
    assert [(t.name, t.tensor_type, tuple(t.shape)) for t in stripped.tensors] == [
        (t.name, t.tensor_type, tuple(t.shape)) for t in original.tensors
    ]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(original.tensors, stripped.tensors))
    with _faster_gguf():
        fast = gguf.GGUFReader(src)
        assert type(fast) is not type(original) and _fields(fast) == want
        assert all(np.array_equal(a.data, b.data) and a.name == b.name for a, b in zip(original.tensors, fast.tensors))
        config = transformers.AutoConfig.from_pretrained(str(copy.parent), gguf_file=copy.name)
        reference = transformers.AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name)
    got, want = config.to_dict(), reference.to_dict()
    assert got.pop("_name_or_path") != want.pop("_name_or_path")  # the folder each was read from
    assert got == want
