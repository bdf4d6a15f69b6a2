"""Which application a uid names, for sends by uid: each API process keeps the answers it looked up,
so sending by uid costs no query either.

Every change that may take a uid from its application, made through whichever process, reaches
every process at its commit: the writing statement NOTIFYs the account's id
(delivery.store.applications.UID_CHANGED_CHANNEL), and each process, listening
(delivery.api.cache_notices), drops that account's uids. While that listening connection is down
the whole cache is emptied, and UID_CACHE_SECONDS bounds an entry's age in any case. Even a stale
entry sends nowhere wrong: the write checks that the application still has the uid
(billing.messages.MessageRequest.application_uid), and the route looks a refused uid up afresh.
"""

from __future__ import annotations

import logging
import time
import uuid

from delivery.store import applications as store

logger = logging.getLogger(__name__)
# A backstop: every change is heard at its commit (above); this bounds an entry's age should one not be.
UID_CACHE_SECONDS = 5.0
UID_CACHE_ENTRIES_MAX = 100_000


class ApplicationUids:
    """One API process's uid -> application id answers, by account (so a notice drops an account's at once)."""

    def __init__(self, pool) -> None:
        self._pool = pool
        self._by_account: dict[uuid.UUID, dict[str, tuple[uuid.UUID, float]]] = {}  # account -> uid -> (id, expires)
        self._entries = 0
        self._forgotten = 0  # notices heard and clears: a lookup across one keeps nothing

    async def id_of(self, account_id: uuid.UUID, uid: str) -> uuid.UUID | None:
        """The id of the account's live application with this uid, None when none has it (not kept)."""
        now = time.monotonic()
        cached = self._by_account.get(account_id, {}).get(uid)
        if cached is not None and cached[1] > now:
            return cached[0]
        forgotten = self._forgotten
        application_id = await store.find_id_by_uid(self._pool, account_id, uid)
        if application_id is not None and forgotten == self._forgotten:  # it may predate a change heard meanwhile
            self._keep(account_id, uid, application_id, now + UID_CACHE_SECONDS)
        return application_id

    def _keep(self, account_id: uuid.UUID, uid: str, application_id: uuid.UUID, expires: float) -> None:
        if self._entries >= UID_CACHE_ENTRIES_MAX:
            self._by_account.clear()
            self._entries = 0
        uids = self._by_account.setdefault(account_id, {})
        self._entries += uid not in uids
        uids[uid] = (application_id, expires)

    def forget(self, account_id: uuid.UUID, uid: str | None = None) -> None:
        """Drop the account's answer for `uid`, or all of the account's when uid is None."""
        self._forgotten += 1
        if uid is None:
            self._entries -= len(self._by_account.pop(account_id, {}))
            return
        uids = self._by_account.get(account_id)
        if uids is not None and uids.pop(uid, None) is not None:
            self._entries -= 1
            if not uids:
                del self._by_account[account_id]

    def clear(self) -> None:
        """Forget every answer: a change may have gone by unheard."""
        self._forgotten += 1
        self._by_account.clear()
        self._entries = 0

    def listeners(self) -> dict[str, object]:
        """The channel this cache hears changes on, with its asyncpg listener."""
        return {store.UID_CHANGED_CHANNEL: self._on_changed}

    def _on_changed(self, connection, pid: int, channel: str, payload: str) -> None:
        try:
            account_id = uuid.UUID(payload)
        except ValueError:
            logger.warning("a malformed application uid notice (%r): every uid is looked up again", payload[:80])
            self.clear()
            return
        self.forget(account_id)
