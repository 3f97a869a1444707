"""Chat with engine arguments from the command line (every vLLM engine argument is accepted; see
docs/VLLM_ARGS.md): ``EngineArgs.add_cli_args``, ``LLM(**vars(args))``, the model's default sampling
parameters changed field by field, one conversation and a batch of them, and a chat template given per call.

    python examples/offline_inference/chat.py --max-tokens 32 --max_model_len 1024 --enforce-eager
"""

from tandem import LLM, EngineArgs
from tandem.utils.argparse_utils import FlexibleArgumentParser

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Name two uses of a hash map."},
]
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def main() -> None:
    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(model="smollm2-135m-instruct")
    group = parser.add_argument_group("sampling")
    group.add_argument("--max-tokens", type=int)
    group.add_argument("--temperature", type=float)
    group.add_argument("--batch", type=int, default=4)
    args = vars(parser.parse_args())
    max_tokens, temperature, batch = args.pop("max_tokens"), args.pop("temperature"), args.pop("batch")

    llm = LLM(**args)
    params = llm.get_default_sampling_params()
    if max_tokens is not None:
        params.max_tokens = max_tokens
    if temperature is not None:
        params.temperature = temperature
    one = llm.chat(CONVERSATION, params, use_tqdm=False)
    print("one:", repr(one[0].outputs[0].text))
    many = llm.chat([CONVERSATION] * batch, params, use_tqdm=True)
    print("batch:", [len(o.outputs[0].token_ids) for o in many])
    templated = llm.chat(CONVERSATION, params, use_tqdm=False, chat_template=TEMPLATE)
    print("own template prompt ends:", repr(templated[0].prompt[-30:]))


if __name__ == "__main__":
    main()
