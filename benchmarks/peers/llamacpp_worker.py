"""llama.cpp through llama-cpp-python's C API, driven by benchmarks/bench_quant.py over JSON lines on
stdin/stdout. Runs in the peer's own venv (benchmarks/peers/setup_llamacpp.sh): it imports nothing of tandem.

One model and one context (a unified KV cache over ``n_seq`` sequences, as ``llama-server -np N`` keeps);
greedy decoding takes the argmax of each sequence's logits, so both engines run the same token-level
workload. Commands (one JSON object per line, one answer per line):
  {"cmd": "generate", "prompts": [[ids], ...], "max_tokens": N}
      every prompt prefilled (one batch per sequence), then N - 1 decode steps that each carry one token of
      every sequence: {"tokens": [[ids], ...], "prefill_s": s, "decode_s": s, "decode_tokens": n}
  {"cmd": "logits", "ids": [...], "out": path}  all positions' logits of one sequence (logits for every
      token, llama.cpp's logits_all) saved as float32 .npy: {"ok": true}
  {"cmd": "quit"}
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import llama_cpp as L
import numpy as np


class Engine:
    def __init__(self, path: str, n_ctx: int, n_seq: int, threads: int, n_batch: int) -> None:
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_batch, n_batch, n_seq
        cp.n_threads = cp.n_threads_batch = threads
        cp.kv_unified = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.n_batch = n_batch
        self.batch = L.llama_batch_init(max(n_batch, n_seq), 0, n_seq)

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> None:
        """items: (token, position, sequence, wants logits)."""
        b = self.batch
        for i, (tok, pos, seq, want) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
            b.seq_id[i][0] = seq
            b.logits[i] = want
        b.n_tokens = len(items)
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _row(self, i: int) -> np.ndarray:
        return np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))

    def clear(self) -> None:
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)

    def generate(self, prompts: list[list[int]], max_tokens: int) -> dict:
        self.clear()
        out: list[list[int]] = [[] for _ in prompts]
        t0 = time.perf_counter()
        for s, ids in enumerate(prompts):
            for start in range(0, len(ids), self.n_batch):
                chunk = ids[start : start + self.n_batch]
                last = start + len(chunk) == len(ids)
                self._decode([(t, start + j, s, last and j == len(chunk) - 1) for j, t in enumerate(chunk)])
            out[s].append(int(np.argmax(self._row(len(ids) - 1 - (len(ids) - 1) // self.n_batch * self.n_batch))))
        t1 = time.perf_counter()
        for _ in range(max_tokens - 1):
            self._decode([(o[-1], len(p) + len(o) - 1, s, True) for s, (p, o) in enumerate(zip(prompts, out))])
            for s, o in enumerate(out):
                o.append(int(np.argmax(self._row(s))))
        t2 = time.perf_counter()
        return {"tokens": out, "prefill_s": t1 - t0, "decode_s": t2 - t1,
                "decode_tokens": (max_tokens - 1) * len(prompts)}

    def logits(self, ids: list[int], path: str) -> dict:
        self.clear()
        rows = []
        for start in range(0, len(ids), self.n_batch):
            chunk = ids[start : start + self.n_batch]
            self._decode([(t, start + j, 0, True) for j, t in enumerate(chunk)])
            rows += [self._row(j).copy() for j in range(len(chunk))]
        np.save(path, np.stack(rows).astype(np.float32))
        return {"ok": True}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--n-seq", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-batch", type=int, default=512)
    a = ap.parse_args()
    eng = Engine(a.model, a.n_ctx, a.n_seq, a.threads, a.n_batch)
    print(json.dumps({"ready": True, "system_info": L.llama_print_system_info().decode()}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "quit":
            break
        if msg["cmd"] == "generate":
            ans = eng.generate(msg["prompts"], msg["max_tokens"])
        elif msg["cmd"] == "logits":
            ans = eng.logits(msg["ids"], msg["out"])
        else:
            ans = {"error": f"unknown cmd {msg['cmd']!r}"}
        print(json.dumps(ans), flush=True)


if __name__ == "__main__":
    main()
