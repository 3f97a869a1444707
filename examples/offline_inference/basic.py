"""The smallest offline run, written the way vLLM users write it: an ``LLM``, ``SamplingParams``, ``generate``.

    python examples/offline_inference/basic.py
"""

from tandem import LLM, SamplingParams

prompts = ["The capital of France is", "def fibonacci(n):", "Three colours of the rainbow are"]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, seed=0)


def main() -> None:
    llm = LLM(model="smollm2-135m-instruct")
    for output in llm.generate(prompts, sampling_params):
        print(f"{output.prompt!r} -> {output.outputs[0].text!r}")


if __name__ == "__main__":
    main()
