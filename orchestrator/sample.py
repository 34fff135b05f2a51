"""Deterministic sample click events, with a small share of invalid ones of each kind.

``sample_events(count, seed)`` yields ``(key, value)`` byte pairs: key = ``str(user_id)``,
value = ``{"user_id": int, "url": str, "ts": epoch-ms int, "duration_ms": int}`` as compact
JSON. The same (count, seed) always gives the same events, and a shorter run is a prefix of a
longer one with the same seed. Nothing here aggregates or normalises URLs: tests compute their
references independently.

URLs are ASCII paths that differ only by the things a normaliser has to handle: letter case,
trailing slashes, query strings, fragments, and the root ``/`` with and without a query.

About ``INVALID_RATE`` (0.1 %) of the events are invalid for each of ``INVALID_KINDS``:

- ``not_json``: truncated JSON or plain text;
- ``missing_field``: one of the four fields left out;
- ``wrong_type``: one field of the wrong JSON type (user_id as a string, bool or float;
  duration_ms as a float or string; url as a number; ts as a string), all fields present;
- ``negative_duration``: otherwise valid, with duration_ms < 0.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

__all__ = [
    "BASE_TS_MS",
    "FIELDS",
    "INVALID_KINDS",
    "INVALID_RATE",
    "URLS",
    "USERS",
    "sample_events",
]

INVALID_KINDS = ("not_json", "missing_field", "wrong_type", "negative_duration")
INVALID_RATE = 0.001  # per kind
FIELDS = ("user_id", "url", "ts", "duration_ms")
BASE_TS_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z
USERS = 5_000  # user ids are 1..USERS
MAX_DURATION_MS = 30_000
MAX_TS_STEP_MS = 20  # ts grows by 0..19 ms per event

_SECTIONS = (
    "products", "cart", "checkout", "search", "blog", "help", "account", "about", "pricing",
    "docs", "news", "careers", "contact", "support", "orders",
)
_ITEMS = (
    "shoes", "shirts", "hats", "bags", "socks", "jackets", "watches", "books", "lamps", "chairs",
    "tables", "phones", "cables", "games", "toys", "plants",
)


def _mixed_case(path: str, rng: random.Random) -> str:
    style = rng.randrange(3)
    if style == 0:
        return path.upper()
    if style == 1:
        return "/".join(part.capitalize() for part in path.split("/"))
    return "".join(c.upper() if rng.random() < 0.5 else c for c in path)


def _build_urls() -> tuple[str, ...]:
    """A fixed pool of a few hundred URLs (the same for every seed)."""
    rng = random.Random(20_240_601)
    paths = [f"/{s}" for s in _SECTIONS]
    paths += [f"/{s}/{i}" for s in _SECTIONS[:6] for i in rng.sample(_ITEMS, 8)]
    paths += [f"/products/{i}/{n}" for i in _ITEMS[:6] for n in rng.sample(range(100, 999), 3)]
    urls = ["/", "/?a=1", "/?utm_source=mail&b=2", "/#top", "/?a=1#x"]
    for path in paths:
        variants = [path]
        for _ in range(3):
            pick = rng.randrange(6)
            if pick == 0:
                variants.append(path + "/")
            elif pick == 1:
                variants.append(_mixed_case(path, rng))
            elif pick == 2:
                variants.append(f"{path}?a={rng.randrange(1, 9)}")
            elif pick == 3:
                variants.append(path + "#x")
            elif pick == 4:
                variants.append(f"{_mixed_case(path, rng)}/?ref=home&a=1")
            else:
                variants.append(f"{path}/#section-{rng.randrange(1, 4)}")
        urls.extend(dict.fromkeys(variants))
    pool = tuple(dict.fromkeys(urls))
    for url in pool:  # values are built by string formatting: keep them JSON-safe
        if not url.isascii() or '"' in url or "\\" in url:
            raise ValueError(f"sample URL {url!r} would need JSON escaping")
    return pool


URLS = _build_urls()
_URLS_N = len(URLS)
_KEYS = tuple(str(u).encode() for u in range(USERS + 1))


def _invalid(
    kind: int, rng: random.Random, *, user: int, url: str, ts: int, duration: int
) -> bytes:
    if kind == 0:  # not JSON
        if rng.random() < 0.5:
            return b"not json"
        full = f'{{"user_id":{user},"url":"{url}","ts":{ts},"duration_ms":{duration}}}'
        return full[: rng.randrange(1, len(full) - 1)].encode()
    if kind == 1:  # one field missing
        values = {"user_id": str(user), "url": f'"{url}"', "ts": str(ts),
                  "duration_ms": str(duration)}
        del values[FIELDS[rng.randrange(len(FIELDS))]]
        return ("{" + ",".join(f'"{k}":{v}' for k, v in values.items()) + "}").encode()
    if kind == 2:  # one field of the wrong type
        u, r, t, d = str(user), f'"{url}"', str(ts), str(duration)
        pick = rng.randrange(7)
        if pick == 0:
            u = f'"{user}"'
        elif pick == 1:
            u = "true"
        elif pick == 2:
            u = f"{user}.5"
        elif pick == 3:
            d = f"{duration}.25"
        elif pick == 4:
            d = f'"{duration}"'
        elif pick == 5:
            r = "42"
        else:
            t = f'"{ts}"'
        return f'{{"user_id":{u},"url":{r},"ts":{t},"duration_ms":{d}}}'.encode()
    # negative duration
    return f'{{"user_id":{user},"url":"{url}","ts":{ts},"duration_ms":{-1 - duration}}}'.encode()


def sample_events(count: int, seed: int) -> Iterator[tuple[bytes, bytes]]:
    """Yield ``count`` deterministic (key, value) events for ``seed``."""
    rng = random.Random(seed)
    rand = rng.random
    urls, n_urls, keys = URLS, _URLS_N, _KEYS
    invalid_below = INVALID_RATE * len(INVALID_KINDS)
    ts = BASE_TS_MS
    for _ in range(count):
        r = rand()
        user = 1 + int(rand() * USERS)
        u = rand()
        url = urls[int(u * u * n_urls)]  # a few popular pages, a long tail
        duration = int(rand() * MAX_DURATION_MS)
        ts += int(r * 1e6) % MAX_TS_STEP_MS
        if r >= invalid_below:
            yield keys[user], (
                f'{{"user_id":{user},"url":"{url}","ts":{ts},"duration_ms":{duration}}}'
            ).encode()
        else:
            kind = int(r / INVALID_RATE)
            yield keys[user], _invalid(kind, rng, user=user, url=url, ts=ts, duration=duration)
