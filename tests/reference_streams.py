"""Independent references for the stream examples, computed from the log with plain Python.

Shares no code with the orchestrator: it reads Kafka with confluent-kafka directly, validates
with the standard json module, and applies each example's documented semantics in dicts.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

from reference import Record, normalise, read_records

__all__ = ["Log", "country_views", "read_records", "url_visitors", "user_profiles",
           "valid_pageview", "valid_profile"]
UNKNOWN = "unknown"
# Continents of the IANA time zone database, as user_profiles v2 documents its regions.
_CONTINENT_REGIONS = {"Europe": "EU", "Asia": "APAC", "Australia": "APAC", "Pacific": "APAC"}


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _json_object(value: bytes | None) -> dict[str, Any] | None:
    try:
        event = json.loads(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return event if isinstance(event, dict) else None


def valid_pageview(value: bytes | None) -> dict[str, Any] | None:
    event = _json_object(value)
    if event is None:
        return None
    if not (_int(event.get("user_id")) and isinstance(event.get("url"), str)
            and _int(event.get("ts")) and _int(event.get("duration_ms"))):
        return None
    return event if event["duration_ms"] >= 0 else None


def valid_profile(value: bytes | None) -> dict[str, Any] | None:
    event = _json_object(value)
    if event is None:
        return None
    address, tags = event.get("address"), event.get("tags")
    if not (_int(event.get("user_id")) and isinstance(event.get("plan"), str)
            and isinstance(address, dict) and isinstance(address.get("country"), str)
            and isinstance(address.get("city"), str) and isinstance(tags, list)
            and all(isinstance(t, str) for t in tags)
            and isinstance(event.get("updated_at"), str)):
        return None
    try:
        at = datetime.fromisoformat(event["updated_at"])
        event["updated_at"] = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    except ValueError:
        return None
    return event


@dataclass
class Log:
    pageviews: list[Record]
    profiles: list[Record]

    @property
    def invalid_pageviews(self) -> set[tuple[int, int]]:
        return {(p, o) for p, o, _, _, v in self.pageviews if valid_pageview(v) is None}

    @property
    def invalid_profiles(self) -> set[tuple[int, int]]:
        # Tombstones are passed to the job, not dead letters.
        return {(p, o) for p, o, _, _, v in self.profiles
                if v is not None and valid_profile(v) is None}


def url_visitors(log: Log) -> dict[str, tuple[int, datetime, datetime]]:
    users: dict[str, set[int]] = defaultdict(set)
    seen: dict[str, list[int]] = {}
    for _, _, ts, _, value in log.pageviews:
        event = valid_pageview(value)
        if event is None:
            continue
        url = normalise(event["url"])
        users[url].add(event["user_id"])
        first, last = seen.get(url, [ts, ts])
        seen[url] = [min(first, ts), max(last, ts)]
    return {url: (len(users[url]), _at(seen[url][0]), _at(seen[url][1])) for url in users}


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def latest_profiles(log: Log) -> dict[int, dict[str, Any] | None]:
    """Per user key, the latest valid profile or None after a tombstone (offset order)."""
    latest: dict[int, dict[str, Any] | None] = {}
    for _, _, _, key, value in log.profiles:  # sorted by (partition, offset); a key is in one
        if key is None:
            continue
        try:
            user = int(key)
        except ValueError:
            continue
        if value is None:
            latest[user] = None
            continue
        profile = valid_profile(value)
        if profile is not None:
            latest[user] = profile
    return latest


def user_profiles(log: Log, *, region: bool = False) -> dict[int, tuple[Any, ...]]:
    rows = {}
    for user, p in latest_profiles(log).items():
        if p is None:
            continue
        country = p["address"]["country"]
        row: tuple[Any, ...] = (p["plan"], country, p["address"]["city"])
        if region:
            row += (region_of(country),)
        rows[user] = (*row, p["tags"], p["updated_at"])
    return rows


@cache
def _zones() -> dict[str, list[tuple[str, float]]]:
    """Country code -> [(time zone, latitude)], from tzdata's zone.tab."""
    zones: dict[str, list[tuple[str, float]]] = defaultdict(list)
    text = resources.files("tzdata").joinpath("zoneinfo", "zone.tab").read_text()
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        country, coordinates, zone = line.split("\t")[:3]
        latitude = re.match(r"([+-])(\d\d)(\d\d)", coordinates)
        assert latitude, line
        sign, degrees, minutes = latitude.groups()
        zones[country].append((zone, (1 if sign == "+" else -1) * (int(degrees)
                                                                   + int(minutes) / 60)))
    return zones


def region_of(country: str) -> str:
    """A country's region, derived from the time zone database rather than copied from the job:
    the continent most of its zones name, and for America north or south of 12°N."""
    zones = _zones().get(country)
    if not zones:
        return "other"
    continents = Counter(zone.split("/")[0] for zone, _ in zones)
    continent = continents.most_common(1)[0][0]
    if continent == "America":
        latitude = next(lat for zone, lat in zones if zone.startswith("America/"))
        return "NA" if latitude >= 12 else "SA"
    return _CONTINENT_REGIONS.get(continent, "other")


def country_views(log: Log) -> dict[str, tuple[int, int]]:
    latest = latest_profiles(log)
    views: dict[int, int] = defaultdict(int)
    for _, _, _, _, value in log.pageviews:
        event = valid_pageview(value)
        if event is not None:
            views[event["user_id"]] += 1
    named = set()
    for _, _, _, _, value in log.profiles:
        profile = valid_profile(value) if value is not None else None
        if profile is not None:
            named.add(profile["address"]["country"])
    result: dict[str, list[int]] = {c: [0, 0] for c in named}
    if views or latest:  # any page view or any profile record of a user
        result.setdefault(UNKNOWN, [0, 0])
    for p in latest.values():
        if p is not None:
            result[p["address"]["country"]][1] += 1
    for user, n in views.items():
        p = latest.get(user)
        result[p["address"]["country"] if p is not None else UNKNOWN][0] += n
    return {c: (v, u) for c, (v, u) in result.items()}
