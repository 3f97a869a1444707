"""What a draft slot is worth: the speculation policy's acceptance estimates (core/spec_policy.py). Pure
Python, no torch.

Per request and draft position j, the probability that draft j is accepted given drafts 1 .. j-1 were: the
request's own accepted / verified counts at j, which fade by ``FADE`` every policy step, mixed with
``PRIOR_WEIGHT`` pseudo-verifications at the estimate of the request's temperature class (greedy / up to 0.8 /
above) — an average over every request, started from the method's prior: the running mean of its
verifications with the prior counted as ``CLASS_PRIOR_COUNT`` of them, until it has seen ``1 / GLOBAL_WEIGHT``,
then a moving average (``GLOBAL_WEIGHT`` a verification), so the few verifications of a deep position (its
explorations) move it. A position the class has never verified reads as the one before it, and its running mean
starts from there: a chain's conditional acceptance changes slowly with depth, and the method's prior says less
about position 6 than position 5's measure does. (Left at the prior, the deep positions a choice never verifies —
only its rare deep explorations do — kept it: suffix decoding at one stream accepted ~0.95 a position at 5-8 yet
had them at ~0.5 after six explorations, so it verified 4 drafts where 8 paid: BENCHMARKS.md §20.) A request
whose drafts were refused and that gets none verified drifts back to its class and is tried again, so a burst of
misses does not switch it off for good.
"""

from __future__ import annotations

from tandem.core.request import Request

FADE = 0.93  # per step, of a request's own acceptance counts (half-life ~10 steps)
PRIOR_WEIGHT = 2.0  # pseudo-verifications at the class estimate
# EWMA weight of one verification in its temperature class's estimate (~100 verifications of memory). At 0.03 an
# estimate's own noise (±0.06 at an acceptance of 0.4) took one stream at 0.7 across its drafting line and left
# it there (BENCHMARKS.md §19).
GLOBAL_WEIGHT = 0.01
CLASS_PRIOR_COUNT = 4.0  # a class estimate's starting value counts as this many verifications
TEMPERATURE_CLASSES = ("greedy", "<=0.8", ">0.8")


def temperature_class(temperature: float) -> int:
    return 0 if temperature < 1e-5 else 1 if temperature <= 0.8 else 2


class Acceptance:
    def __init__(self, k: int, prior: float) -> None:
        self.k = k
        self.by_class = [[prior] * k for _ in TEMPERATURE_CLASSES]
        self.class_counts = [[0] * k for _ in TEMPERATURE_CLASSES]  # verifications seen per class and position
        # request id -> (accepted counts, verified counts) per position, and the step they were last faded at
        self.by_request: dict[str, tuple[list[float], list[float], int]] = {}
        self.step = 0  # advanced by the policy, once a plan
        # request id -> (its temperature class, whether it is seeded and samples), learned once
        self.kinds: dict[str, tuple[int, bool]] = {}

    def kind_of(self, req: Request) -> tuple[int, bool]:
        kind = self.kinds.get(req.request_id)
        if kind is None:
            p = req.sampling_params
            kind = self.kinds[req.request_id] = (temperature_class(p.temperature),
                                                 p.seed is not None and p.temperature >= 1e-5)
        return kind

    def alpha(self, req: Request) -> list[float]:
        """Per position, the request's conditional acceptance (its kind learned first: ``kind_of``)."""
        cls = self.by_class[self.kinds[req.request_id][0]]
        own = self._own(req.request_id)
        if own is None:
            return cls
        acc, n = own
        return [(a + PRIOR_WEIGHT * c) / (v + PRIOR_WEIGHT) for a, v, c in zip(acc, n, cls)]

    def _own(self, rid: str) -> tuple[list[float], list[float]] | None:
        """The request's counts, faded to this step."""
        rec = self.by_request.get(rid)
        if rec is None:
            return None
        acc, n, at = rec
        if at != self.step:
            w = FADE ** (self.step - at)
            acc, n = [a * w for a in acc], [v * w for v in n]
            self.by_request[rid] = (acc, n, self.step)
        return acc, n

    def observe(self, req: Request, num_positions: int, num_accepted: int, own_counts: bool = True) -> None:
        """A chain of ``req`` came back: positions 1 .. ``num_positions`` were tried (verified, or scheduled
        and left empty: a miss) and the first ``num_accepted`` accepted. ``own_counts`` False: only the class
        learns (a shadow's score, core/shadow.py)."""
        c = self.kind_of(req)[0]
        cls, counts = self.by_class[c], self.class_counts[c]
        own = None
        if own_counts:
            own = self._own(req.request_id)
            if own is None:
                own = ([0.0] * self.k, [0.0] * self.k)
                self.by_request[req.request_id] = (*own, self.step)
        tried = min(num_accepted + 1, num_positions, self.k)
        for j in range(tried):
            hit = 1.0 if j < num_accepted else 0.0
            if own is not None:
                own[0][j] += hit
                own[1][j] += 1.0
            counts[j] += 1
            cls[j] += max(GLOBAL_WEIGHT, 1.0 / (counts[j] + CLASS_PRIOR_COUNT)) * (hit - cls[j])
        # Positions never verified in the class read as the one before them. Verified positions are always a
        # prefix, so only a chain reaching past the deepest one the class has seen changes what they read.
        if 0 < tried < self.k and counts[tried] == 0:
            cls[tried:] = [cls[tried - 1]] * (self.k - tried)

    def forget(self, request_id: str) -> None:
        self.by_request.pop(request_id, None)
        self.kinds.pop(request_id, None)
