"""The SQL side of the runtime, behind one :class:`Store` protocol (:mod:`.protocol`).

One implementation per dialect (:mod:`.postgres`, :mod:`.sqlite`, :mod:`.mysql`), chosen once by
:func:`open_store` where the App builds its engine; the loops call the protocol and never ask
which database they run on. The statements every dialect shares are SQLAlchemy Core in
:mod:`.submit`, :mod:`.outbox`, :mod:`.execution`, :mod:`.results`, :mod:`.leases`,
:mod:`.recovery`, :mod:`.queries` and :mod:`.retention`; a dialect's own statements live in its
module (PostgreSQL's named statements in ``sql/postgres.sql``). Bound parameters only.
"""

from __future__ import annotations

from .factory import open_store
from .protocol import DatabaseFacts, DatabaseProblem, Store

__all__ = ["DatabaseFacts", "DatabaseProblem", "Store", "open_store"]
