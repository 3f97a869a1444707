"""lm-evaluation-harness against tandem's server: its ``local-completions`` model runs a loglikelihood task (a small
local dataset written here) through ``/v1/completions`` (``echo``, ``logprobs``), and each sample's score must equal
the sum of tandem's offline ``prompt_logprobs`` over the continuation's tokens.

    benchmarks/clients/setup_clients.sh                      # .venv-clients: lm_eval, schemathesis
    .venv/bin/python benchmarks/clients/lm_eval_loglikelihood.py [--out bench_out/lm_eval]

Prints one line per sample and the largest difference; exits 1 if any differs by more than 1e-3 (JSON floats and
a batch composition that may differ between the two runs), or if lm_eval fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the test suite's server launcher (tests/entrypoints/remote.py)
sys.path.insert(0, str(ROOT))

DOCS = [
    {"context": "The capital of France is", "continuation": " Paris"},
    {"context": "def add(a, b):\n    return", "continuation": " a + b"},
    {"context": "Water boils at 100 degrees", "continuation": " Celsius"},
    {"context": "The opposite of hot is", "continuation": " cold"},
    {"context": "1, 2, 3, 4,", "continuation": " 5, 6"},
    {"context": "import numpy as", "continuation": " np"},
]
TASK = """task: tandem_loglikelihood
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
metric_list:
  - metric: acc
"""


def hf_tokenizer_dir(model: str, out: Path) -> Path:
    """The model's tokenizer in HF form (lm_eval tokenizes with transformers), from its GGUF file."""
    from transformers import AutoTokenizer

    from tandem.model.loader.registry import resolve_model

    path = resolve_model(model)
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(out)
    return out


def offline_scores(model: str, docs: list[dict]) -> list[float]:
    """Each continuation's log-likelihood from tandem's offline prompt_logprobs, tokenized as lm_eval does
    (trailing context spaces move to the continuation; the continuation = whole minus context tokens)."""
    from tandem import LLM, SamplingParams

    llm = LLM(model, max_model_len=512, num_kv_blocks=256)
    tok = llm.get_tokenizer()
    scores = []
    for doc in docs:
        context, cont = doc["context"], doc["continuation"]
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, cont = context[:-spaces], context[-spaces:] + cont
        whole = tok.encode(context + cont, add_special_tokens=False)
        ctx = tok.encode(context, add_special_tokens=False)
        out = llm.generate({"prompt_token_ids": whole}, SamplingParams(max_tokens=1, prompt_logprobs=0,
                                                                         temperature=0), use_tqdm=False)[0]
        scores.append(sum(out.prompt_logprobs[i][whole[i]].logprob for i in range(len(ctx), len(whole))))
    llm.shutdown()
    return scores


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--out", default=str(ROOT / "bench_out" / "lm_eval"))
    ns = p.parse_args()
    lm_eval = ROOT / ".venv-clients" / "bin" / "lm_eval"
    if not lm_eval.exists():
        sys.exit("run benchmarks/clients/setup_clients.sh first")
    from entrypoints.remote import launch

    work = Path(tempfile.mkdtemp(prefix="tandem-lm-eval-"))
    data = work / "data.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (work / "tasks").mkdir()
    (work / "tasks" / "tandem_loglikelihood.yaml").write_text(TASK.format(data=data))
    tokenizer = hf_tokenizer_dir(ns.model, work / "tokenizer")
    out = Path(ns.out)
    with launch("--model", ns.model, "--max-model-len", "512", "--served-model-name", ns.model) as srv:
        print(f"[lm_eval] server {srv.url}; running local-completions on {len(DOCS)} samples", flush=True)
        args = (f"base_url={srv.url}/v1/completions,model={ns.model},tokenizer={tokenizer},"
                "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=2,max_retries=1")
        done = subprocess.run([str(lm_eval), "--model", "local-completions", "--model_args", args,
                               "--tasks", "tandem_loglikelihood", "--include_path", str(work / "tasks"),
                               "--log_samples", "--output_path", str(out)], capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:])
            return 1
    samples = sorted(out.rglob("samples_tandem_loglikelihood_*.jsonl"), key=lambda f: f.stat().st_mtime)[-1]
    rows = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda r: r["doc_id"])
    theirs = [float(r["filtered_resps"][0][0]) for r in rows]
    ours = offline_scores(ns.model, [r["doc"] for r in rows])
    worst = 0.0
    for r, a, b in zip(rows, theirs, ours):
        worst = max(worst, abs(a - b))
        print(f"{r['doc']['context']!r:40} {r['doc']['continuation']!r:10} lm_eval {a:10.5f}  tandem offline {b:10.5f}")
    print(f"[lm_eval] {len(rows)} samples, largest difference {worst:.2e}; lm_eval's acc {rows and sum(r['acc'] for r in rows) / len(rows):.3f}")
    return 0 if worst <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
