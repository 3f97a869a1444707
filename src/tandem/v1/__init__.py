"""vLLM's ``vllm.v1`` module paths that scripts import, mapped to tandem's modules."""
