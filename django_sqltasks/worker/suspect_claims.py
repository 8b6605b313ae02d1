"""The claim loop's suspects (``suspects.py``): claiming those that wait, as far as the room
for them allows, and clearing the one running alone here once it passes its time bound. Their
statements are ``Claims``', run on the database thread."""

from __future__ import annotations

import logging

from ..sql import ClaimedRow
from . import events
from .claims import Claims
from .liveness import FailingRoles
from .retries import DatabaseThread
from .slots import Slots
from .suspects import Suspects

logger = logging.getLogger("django_sqltasks")


class SuspectClaims:
    """Claim and clear suspects for the claim loop (on the loop thread)."""

    def __init__(
        self,
        suspects: Suspects,
        *,
        claims: Claims,
        slots: Slots,
        db: DatabaseThread,
        failing: FailingRoles,
    ) -> None:
        # Set once here.
        self._suspects = suspects
        self._claims = claims
        self._worker_id = claims.worker_id
        self._slots = slots
        self._db = db
        self._failing = failing

    async def claim(self, free: int) -> list[ClaimedRow]:
        """Claim the suspects that wait and that their limits let start, up to ``free``: of a
        first death, beside each other in up to half of the slots; of the others, one to run
        alone in one slot if none runs alone here (see ``suspects``). Return their rows, for
        the producer to start ahead of those waiting for a slot."""
        suspects = self._suspects
        alone = suspects.may_claim(self._slots)
        beside = min(free - alone, suspects.room_beside(self._slots))
        if beside <= 0 and not alone:
            return []
        try:
            claimed = await self._db.call(self._claims.claim_suspects, max(0, beside), alone)
        except Exception:
            self._failing.failed("claiming")
            logger.exception(
                "Claiming a suspect task failed worker_id=%s; retrying", self._worker_id
            )
            return []
        self._failing.succeeded("claiming")
        took_alone = False
        for row, suspect in claimed:
            if suspect.together:
                suspects.took_beside(row.id)
                logger.info(
                    "Running task id=%s beside the other tasks that lost a worker: its worker "
                    "died while it ran; if this worker dies too, it runs alone next",
                    row.id,
                    extra={
                        "action": "suspect_together",
                        "task_id": row.id,
                        "worker_id": self._worker_id,
                    },
                )
                continue
            took_alone = True
            logger.warning(
                "Running task id=%s alone in one slot: its worker died while it ran beside "
                "other tasks, and any of them may have killed it",
                row.id,
                extra={"action": "suspect_alone", "task_id": row.id, "worker_id": self._worker_id},
            )
            suspects.took(row.id, suspect.bounded)
        # None waits, or their limits are full: look again when told, or at a burst end.
        suspects.looked(
            alone=alone,
            took_alone=took_alone,
            beside=max(0, beside),
            took_beside=len(claimed) - took_alone,
        )
        return [row for row, _ in claimed]

    async def clear(self) -> None:
        """The suspect running alone here reached its time bound: clear it, so that the next
        suspect may start here (see ``suspects``)."""
        task_id = self._suspects.to_clear()
        assert task_id is not None
        self._suspects.cleared()
        try:
            cleared = await self._db.call(self._claims.clear_suspect, task_id)
        except Exception:
            # Not retried: it keeps its mark, and is charged if its worker dies beside the
            # next suspect (a crash during a database fault).
            self._failing.failed("claiming")
            logger.exception("Clearing suspect task id=%s failed", task_id)
            return
        if not cleared:
            return  # it ended meanwhile
        logger.info(
            "Task id=%s ran alone for %ss without killing its worker: the next suspect may "
            "start beside it",
            task_id,
            self._suspects.bound,
            extra={"action": "suspect_cleared", "task_id": task_id, "worker_id": self._worker_id},
        )
        events.emit("suspect_cleared", worker_id=self._worker_id, task_id=str(task_id))
