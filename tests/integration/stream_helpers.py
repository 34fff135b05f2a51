"""Stream examples re-pointed at a test's own topics, and their tables read back."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {
    "url_visitors": "jobs/url_visitors/v1.py",
    "user_profiles": "jobs/user_profiles/v1.py",
    "user_profiles_v2": "jobs/user_profiles/v2.py",
    "country_views": "jobs/country_views/v1",
}


def example(tmp_path: Path, which: str, topics: dict[str, str], version: str | None = None
            ) -> Path:
    """A copy of a shipped example reading ``topics`` ({"pageviews": "pageviews_ab12", ...})
    instead of the shipped names, optionally under another VERSION label."""
    source = ROOT / EXAMPLES[which]
    target = tmp_path / "jobs" / f"{which}_{version or 'shipped'}"
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        entry = target / "job.py"
    else:
        target.mkdir(parents=True)
        entry = target / source.name
        shutil.copy(source, entry)
    text = entry.read_text()
    for shipped, ours in topics.items():
        text = text.replace(f'"{shipped}"', f'"{ours}"')
    if version is not None:
        text = re.sub(r'^VERSION = .*$', f'VERSION = "{version}"', text, flags=re.M)
    entry.write_text(text)
    return target if source.is_dir() else entry


def table(settings: Any, name: str, key: str, columns: list[str]) -> dict[Any, tuple[Any, ...]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT {}, {} FROM {}.{}").format(
            sql.Identifier(key), sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.Identifier(settings.data_schema), sql.Identifier(name))).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def dead_letter_offsets(settings: Any, name: str, topic: str) -> set[tuple[int, int]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT partition, \"offset\" FROM {}.{} WHERE topic = %s").format(
            sql.Identifier(settings.data_schema), sql.Identifier(name)), (topic,)).fetchall()
    return {(p, o) for p, o in rows}
