"""Stop conditions checked after each returned token (docs/SEMANTICS.md §3). Pure Python.

Token-level conditions live here; stop *strings* need detokenized text and are checked by the engine's
output processor, which then finishes the request through ``Scheduler.finish_requests``.
"""

from __future__ import annotations

from tandem.core.request import Request, RequestStatus


def check_stop(req: Request, token_id: int) -> RequestStatus | None:
    """Status to finish with after ``token_id`` was appended to ``req.output_token_ids``, else None.

    Sets ``req.stop_reason`` to the stop token id when a ``stop_token_ids`` entry matched.
    """
    params = req.sampling_params
    n_out = len(req.output_token_ids)
    if n_out >= params.min_tokens:
        if not params.ignore_eos and token_id in req.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if token_id in params.stop_token_ids:
            req.stop_reason = token_id
            return RequestStatus.FINISHED_STOPPED
    if req.max_tokens is not None and n_out >= req.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    if req.max_model_len is not None and len(req.prompt_token_ids) + n_out >= req.max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None
