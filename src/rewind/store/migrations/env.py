"""Alembic environment for Rewind's store.

Rewind runs migrations itself when a store is opened (:func:`rewind.store.migrate.upgrade`), on a
connection it already holds inside a write transaction (``config.attributes["connection"]``), so
the schema change and the version stamp commit together or not at all. Run standalone (``alembic
-c src/rewind/store/alembic.ini -x url=… upgrade head``) it opens the URL it is given.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from rewind.store.schema import metadata

config = context.config


def _run(connection: object) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things in place: batch mode copies the table instead.
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
elif context.is_offline_mode():
    context.configure(url=context.get_x_argument(as_dictionary=True)["url"], literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(context.get_x_argument(as_dictionary=True)["url"])
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()
