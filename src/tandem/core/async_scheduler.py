"""The async scheduler: the same scheduler, able to schedule step N+1 while step N is in flight.

What changes with async (docs/SEMANTICS.md §3):
- a running request is scheduled again while its previous step is in flight: its next input token is a
  placeholder the runner fills from its own (device) copy of step N's sampled token;
- drafts are not known on the host: after scheduling a step that samples, ``spec_token_ids`` becomes
  ``[-1] * k`` — k draft slots whose values stay on the device;
- no scheduling past a guaranteed limit: every sampling step in flight guarantees one token, so a request
  whose in-flight steps already reach ``max_tokens`` (or ``max_model_len``) is not scheduled again.
  Draft slots are bounded by the same guaranteed count; the runner, which knows the exact accepted
  counts, fills only the slots that fit (the rest stay -1 and count as rejected).
"""

from __future__ import annotations

from tandem.core.limits import remaining_tokens
from tandem.core.request import Request
from tandem.core.scheduler import Scheduler


class AsyncScheduler(Scheduler):
    is_async = True

    @staticmethod
    def _guaranteed_remaining(req: Request) -> int:
        """Tokens still allowed if each in-flight sampling step yields exactly its one sure token."""
        sure = sum(1 for step in req.inflight if step.samples)
        return remaining_tokens(len(req.prompt_token_ids) + len(req.output_token_ids), len(req.prompt_token_ids),
                                req.max_tokens, req.max_model_len, sure)

    def _can_schedule_running(self, req: Request) -> bool:
        return self._guaranteed_remaining(req) > 0

    _room = _guaranteed_remaining  # type: ignore[assignment]
