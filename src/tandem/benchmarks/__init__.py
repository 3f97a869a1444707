"""vLLM's ``vllm.benchmarks`` module paths that scripts import (``datasets``)."""
