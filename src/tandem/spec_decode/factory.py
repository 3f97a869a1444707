"""Name -> proposer class, and building a proposer for a target model."""

from __future__ import annotations

from typing import Any

from tandem.config import SpeculativeConfig
from tandem.spec_decode.proposer import Proposer


def proposer_classes() -> dict[str, type[Proposer]]:
    from tandem.spec_decode.ngram import NgramProposer
    from tandem.spec_decode.suffix import SuffixProposer

    classes: dict[str, type[Proposer]] = {NgramProposer.method: NgramProposer, SuffixProposer.method: SuffixProposer}
    try:
        from tandem.spec_decode.draft_model import DraftModelProposer

        classes[DraftModelProposer.method] = DraftModelProposer
    except ImportError:  # pragma: no cover - while a method is being built
        pass
    from tandem.spec_decode.eagle import Eagle3Proposer, EagleProposer
    from tandem.spec_decode.mtp import MtpProposer

    for cls in (EagleProposer, Eagle3Proposer, MtpProposer):
        classes[cls.method] = cls
    return classes


def get_proposer_class(method: str) -> type[Proposer]:
    classes = proposer_classes()
    if method not in classes:
        raise ValueError(
            f"speculative method {method!r} is not available; choose one of {sorted(classes)}"
        )
    return classes[method]


def build_proposer(config: SpeculativeConfig, **kwargs: Any) -> Proposer:
    return get_proposer_class(config.method).build(config, **kwargs)  # type: ignore[attr-defined]
