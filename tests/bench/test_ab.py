"""``tandem bench ab`` end to end on the default model (small): every report field, identical outputs
across arms, placeholders back to zero, plots written."""

from __future__ import annotations

import json

import pytest

from tandem.entrypoints.cli import main

pytestmark = pytest.mark.slow


def test_bench_ab_report(tmp_path):
    out = tmp_path / "ab"
    rc = main([
        "bench", "ab", "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 3, "policy": "fixed"}',  # drafts every step: the report's acceptance fields filled
        "--dataset-name", "repetition", "--num-prompts", "6", "--max-concurrency", "3",
        "--output-len", "12", "--repeats", "2", "--seed", "1", "--out", str(out),
    ])
    assert rc == 0
    doc = json.loads((out / "report.json").read_text())
    contract = doc["contract"]
    for key in ("model", "model_sha256", "tandem_version", "git_commit", "dtype", "device", "cpu",
                "cores", "workload", "speculation", "sampling", "repeats", "arms"):
        assert key in contract, key
    assert len(contract["model_sha256"]) == 64
    assert contract["speculation"]["method"] == "ngram"
    assert contract["workload"]["dataset"] == "repetition"
    assert set(contract["workload"]["input_len"]) == {"min", "mean", "median", "max"}
    assert doc["output_identity"]["all_identical"] is True
    assert len(doc["runs"]) == 6  # 3 arms x 2 repeats, interleaved
    assert [r["arm"] for r in doc["runs"]] == ["A", "B", "C", "A", "B", "C"]
    for arm in ("A", "B", "C"):
        s = doc["summary"][arm]
        for key in ("output_tok_s", "ttft_ms_p50", "tpot_ms_p50", "itl_ms_p99", "step_wall_ms_p50",
                    "schedule_overlap_ratio", "exposed_wait_ms", "proposed", "accepted", "rejected",
                    "preemptions", "errors", "placeholders_left"):
            assert key in s and set(s[key]) == {"median", "min", "max"}, key
        assert s["placeholders_left"]["max"] == 0 and s["errors"]["max"] == 0
        assert s["proposed"]["median"] > 0
        assert 1.0 <= s["mean_acceptance_length"]["median"] <= 4.0  # k = 3: bonus + at most 3
    assert doc["summary"]["A"]["schedule_overlap_ratio"]["median"] < 0.1
    assert doc["summary"]["B"]["schedule_overlap_ratio"]["median"] > 0.5
    assert doc["summary"]["C"]["wait_accepted_counts_ms"]["max"] == 0
    md = (out / "report.md").read_text()
    assert "## Contract" in md and "Output identity" in md
    for png in ("step_time.png", "overlap.png", "acceptance.png", "tpot_cdf.png"):
        assert (out / png).stat().st_size > 1000
    for arm in ("A", "B", "C"):
        assert (out / f"trace_{arm}.json").is_file()
