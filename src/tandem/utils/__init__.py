"""vLLM's ``vllm.utils`` names that scripts import (``FlexibleArgumentParser``)."""

from tandem.utils.argparse_utils import FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser"]
