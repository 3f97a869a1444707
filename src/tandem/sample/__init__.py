"""Sampling: logits processors, the sampler, position-keyed randomness, the rejection sampler."""

from __future__ import annotations

from tandem.sample.logits_processors import (
    apply_logit_bias_and_allowed,
    apply_min_p,
    apply_min_tokens_mask,
    apply_penalties,
    apply_temperature,
    apply_top_k_top_p,
)
from tandem.sample.metadata import RowSpec, SamplingMetadata
from tandem.sample.rejection import (
    RejectionOutput,
    RejectionSampler,
    greedy_verify,
    greedy_verify_rows,
    num_accepted,
    rejection_sample,
)
from tandem.sample.rng import make_generator, position_key
from tandem.sample.sampler import LogprobsTensors, Sampler, SamplerOutput, compute_logprobs

__all__ = [
    "LogprobsTensors",
    "RejectionOutput",
    "RejectionSampler",
    "RowSpec",
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "apply_logit_bias_and_allowed",
    "apply_min_p",
    "apply_min_tokens_mask",
    "apply_penalties",
    "apply_temperature",
    "apply_top_k_top_p",
    "compute_logprobs",
    "greedy_verify",
    "greedy_verify_rows",
    "make_generator",
    "num_accepted",
    "position_key",
    "rejection_sample",
]
