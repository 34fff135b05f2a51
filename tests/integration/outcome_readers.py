"""An application that reads an alias by key and writes what its readers did: the outcome
cutover tests' traffic, whose true conversion rate depends on the version that served a key
(the alias's served_by column says which)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

JOB = "pageview_counts"


def create_outcomes_table(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL(
            "CREATE TABLE {}.outcomes (key text NOT NULL, converted int NOT NULL, erred int "
            "NOT NULL, observed_at timestamptz NOT NULL DEFAULT clock_timestamp())").format(
            sql.Identifier(schema)))


def shared_keys(settings: Any, *versions: str) -> list[str]:
    """The keys that every one of the versions' tables holds, so that any of them can serve
    every key the readers draw."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        query = sql.SQL(" INTERSECT ").join(
            sql.SQL("SELECT url FROM {}.{}").format(sql.Identifier(settings.data_schema),
                                                     sql.Identifier(f"{JOB}__{v}"))
            for v in versions)
        return [r[0] for r in conn.execute(query + sql.SQL(" ORDER BY 1")).fetchall()]


class Application(threading.Thread):
    """Readers of the alias, and what they did: per tick, ``per_tick`` reads of keys drawn
    with a fixed seed, each converting (and erring) with its serving version's true rate. The
    same seed gives the same keys and the same draws, whatever serves them."""

    def __init__(self, settings: Any, schema: str, keys: list[str],
                 converts: dict[str, float], errors: dict[str, float], *, seed: int,
                 per_tick: int = 40, tick_s: float = 0.1,
                 on_read: Callable[[str, int], None] | None = None,
                 key_rates: dict[str, float] | None = None):
        super().__init__(daemon=True)
        self.settings, self.schema, self.keys = settings, schema, keys
        self.converts, self.errors, self.seed = converts, errors, seed
        self.per_tick, self.tick_s = per_tick, tick_s
        self.on_read = on_read  # (serving version, converted) per read, e.g. into counters
        # Keys that differ: a key converts at its own rate times its version's factor in
        # ``converts`` (1.0: as the key does anyway); without them every key alike.
        self.key_rates = key_rates
        self.halt = threading.Event()
        self.served: dict[str, int] = {}
        self.failure: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(self.seed)
        view = sql.SQL("{}.{}").format(sql.Identifier(self.settings.serving_schema),
                                       sql.Identifier(JOB))
        table = sql.SQL("{}.outcomes").format(sql.Identifier(self.schema))
        try:
            with psycopg.connect(self.settings.pg_dsn, autocommit=True) as conn:
                while True:
                    drawn = [(rng.choice(self.keys), rng.random(), rng.random())
                             for _ in range(self.per_tick)]
                    serving = dict(conn.execute(sql.SQL(
                        "SELECT url, served_by FROM {} WHERE url = ANY(%s)").format(view),
                        ([k for k, _, _ in drawn],)).fetchall())
                    rows = []
                    for key, u_convert, u_error in drawn:
                        version = serving[key]
                        self.served[version] = self.served.get(version, 0) + 1
                        rate = self.converts[version] * (self.key_rates[key] if self.key_rates
                                                         else 1.0)
                        rows.append((key, int(u_convert < rate),
                                     int(u_error < self.errors[version])))
                        if self.on_read is not None:
                            self.on_read(version, rows[-1][1])
                    with conn.cursor().copy(sql.SQL(
                            "COPY {} (key, converted, erred) FROM STDIN").format(table)) as copy:
                        for row in rows:
                            copy.write_row(row)
                    if self.halt.wait(self.tick_s):  # a tick's pace; stop at once
                        break
        except BaseException as exc:
            self.failure = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(30)
        assert self.failure is None, repr(self.failure)
