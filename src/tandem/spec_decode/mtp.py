"""MTP proposer: the multi-token-prediction layer shipped inside the target checkpoint (DeepSeek-V3 naming).

It drafts exactly like EAGLE (see ``eagle.py``); what differs is where the head comes from and what it
shares: the MTP layer is read from the target's own checkpoint directory (``model.layers.{L}.*``), and it
always uses the target's embedding and LM head — the very tensors, whatever copies the checkpoint holds.
The target is found, in order: ``speculative_config.model`` (a target checkpoint with an MTP layer), the
checkpoint the target was loaded from, the MTP layer shipped for the target (assembled into a local
checkpoint directory on first use, see ``shipped.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem.config import SpeculativeConfig
from tandem.model.loader import Checkpoint
from tandem.model.transformer import CausalLM
from tandem.spec_decode.eagle import DraftHeadProposer
from tandem.spec_decode.eagle_checkpoint import (
    check_against_target,
    has_mtp_weights,
    load_mtp_layer,
)


class MtpProposer(DraftHeadProposer):
    method = "mtp"

    @classmethod
    def build(
        cls,
        config: SpeculativeConfig,
        *,
        target: CausalLM,
        target_checkpoint: Checkpoint | None = None,
        num_kv_blocks: int,
        block_size: int,
        **_: Any,
    ) -> DraftHeadProposer:
        from tandem.spec_decode.shipped import shipped_mtp_for_target

        if config.eagle3_layer_ids is not None:
            raise ValueError("speculative_config.eagle3_layer_ids applies to method 'eagle3' only")
        args = target.args
        if config.model:
            directory = Path(config.model).expanduser()
        else:
            source = target_checkpoint.source if target_checkpoint is not None else None
            directory = source if source is not None and source.is_dir() else Path("<none>")
            if not has_mtp_weights(directory, args):
                shipped = shipped_mtp_for_target(target_checkpoint)
                if shipped is not None:
                    directory = shipped
                elif source is not None:
                    directory = source
        cfg, tensors = load_mtp_layer(directory, args)
        check_against_target(cfg, args, directory)
        return cls.from_head(config, cfg, tensors, target, num_kv_blocks, block_size)
