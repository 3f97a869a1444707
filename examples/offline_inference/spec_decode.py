"""Speculative decoding with vLLM's keywords and read-back: a ``speculative_config`` carrying vLLM's keys,
vLLM's engine arguments that have nothing to do on this machine (recorded, see docs/VLLM_ARGS.md), token-id
prompts with vLLM's ``multi_modal_data`` key, and the acceptance read from ``get_metrics()``'s counters.

    python examples/offline_inference/spec_decode.py --method eagle3 --num-prompts 4 --output-len 64
"""

import argparse

from tandem import LLM, SamplingParams
from tandem.benchmarks.datasets import add_dataset_parser, get_samples
from tandem.v1.metrics.reader import Counter, Vector


def main() -> None:
    parser = argparse.ArgumentParser()
    add_dataset_parser(parser)
    parser.set_defaults(dataset_name="humaneval", num_prompts=4)
    parser.add_argument("--method", default="eagle3", choices=["ngram", "eagle", "eagle3", "mtp", "draft_model"])
    parser.add_argument("--num-spec-tokens", type=int, default=3)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()

    spec = {"method": args.method, "num_speculative_tokens": args.num_spec_tokens}
    if args.method == "ngram":
        spec.update(prompt_lookup_min=2, prompt_lookup_max=5)
    if args.method in ("eagle", "eagle3", "draft_model"):
        spec.update(disable_padded_drafter_batch=False, parallel_drafting=False)
    llm = LLM(model=args.model, trust_remote_code=True, enable_chunked_prefill=False, enforce_eager=True,
              speculative_config=spec, disable_log_stats=False, max_model_len=2048, max_num_seqs=8,
              limit_mm_per_prompt={"image": 5}, disable_chunked_mm_input=True, allowed_local_media_path="")
    tokenizer = llm.get_tokenizer()
    samples = get_samples(args, tokenizer)
    prompts = [{"prompt_token_ids": tokenizer.encode(s.prompt), "multi_modal_data": s.multi_modal_data}
               for s in samples]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=args.output_len))

    found = {}
    for metric in llm.get_metrics():
        if metric.name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens"):
            assert isinstance(metric, Counter)
            found[metric.name] = metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            assert isinstance(metric, Vector)
            per_pos = metric.values
    drafts = found["vllm:spec_decode_num_drafts"]
    print(f"output tokens: {sum(len(o.outputs[0].token_ids) for o in outputs)}")
    print(f"mean acceptance length: {1 + found['vllm:spec_decode_num_accepted_tokens'] / max(drafts, 1):.2f}")
    print("acceptance per position:", [round(v / max(drafts, 1), 2) for v in per_pos])


if __name__ == "__main__":
    main()
