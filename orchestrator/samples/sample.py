"""Deterministic sample click events, with a small share of invalid ones of each kind.

``sample_events(count, seed, *, users=USERS, invalid_share=None)`` yields ``(key, value)``
byte pairs: key = ``str(user_id)`` with user_id uniform in ``1..users``, value =
``{"user_id": int, "url": str, "ts": epoch-ms int, "duration_ms": int}`` as compact JSON. The
same (count, seed, users, invalid_share) always gives the same events, and a shorter run is a
prefix of a longer one with the same other arguments. The defaults give the same bytes as
before the two keywords existed. Nothing here aggregates or normalises URLs: tests compute
their references independently.

URLs are ASCII paths that differ only by the things a normaliser has to handle: letter case,
trailing slashes, query strings, fragments, and the root ``/`` with and without a query.

About ``INVALID_RATE`` (0.1 %) of the events are invalid for each of ``INVALID_KINDS``; with
``invalid_share`` (in [0, 1)) about that share of all events is invalid, a quarter of it for
each kind:

- ``not_json``: truncated JSON or plain text;
- ``missing_field``: one of the four fields left out;
- ``wrong_type``: one field of the wrong JSON type (user_id as a string, bool or float;
  duration_ms as a float or string; url as a number; ts as a string), all fields present;
- ``negative_duration``: otherwise valid, with duration_ms < 0.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from orchestrator.errors import KappaError

__all__ = [
    "BASE_TS_MS",
    "FIELDS",
    "INVALID_KINDS",
    "INVALID_RATE",
    "URLS",
    "USERS",
    "check_share",
    "check_users",
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
_KEYS = tuple(str(u).encode() for u in range(USERS + 1))  # users above USERS: built per event


def check_users(users: int) -> int:
    """``users`` if it is an int >= 1, else a one-line KappaError."""
    if isinstance(users, bool) or not isinstance(users, int) or users < 1:
        raise KappaError(f"users must be a whole number >= 1, not {users!r}")
    return users


def check_share(invalid_share: float, name: str = "invalid_share") -> float:
    """``invalid_share`` as a float if it is in [0, 1), else a one-line KappaError."""
    try:
        share = float(invalid_share)
    except (TypeError, ValueError):
        share = float("nan")
    if isinstance(invalid_share, bool) or not 0.0 <= share < 1.0:
        raise KappaError(f"{name} must be a number in [0, 1), not {invalid_share!r}")
    return share


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


def sample_events(
    count: int, seed: int, *, users: int = USERS, invalid_share: float | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """Yield ``count`` deterministic (key, value) events for ``seed``.

    ``users``: user ids are ``1..users``. ``invalid_share``: the share of invalid events, split
    evenly over ``INVALID_KINDS`` (None: ``INVALID_RATE`` per kind). Arguments are checked
    here, before the first event: a bad one raises a one-line KappaError.
    """
    check_users(users)
    per_kind = INVALID_RATE if invalid_share is None else check_share(invalid_share) / len(
        INVALID_KINDS)
    return _events(count, seed, users, per_kind, _KEYS if users <= USERS else ())


def _events(
    count: int, seed: int, users: int, per_kind: float, keys: tuple[bytes, ...]
) -> Iterator[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    rand = rng.random
    urls, n_urls = URLS, _URLS_N
    invalid_below = per_kind * len(INVALID_KINDS)
    last_kind = len(INVALID_KINDS) - 1
    ts = BASE_TS_MS
    for _ in range(count):
        r = rand()
        user = 1 + int(rand() * users)
        u = rand()
        url = urls[int(u * u * n_urls)]  # a few popular pages, a long tail
        duration = int(rand() * MAX_DURATION_MS)
        ts += int(r * 1e6) % MAX_TS_STEP_MS
        key = keys[user] if keys else str(user).encode()
        if r >= invalid_below:
            yield key, (
                f'{{"user_id":{user},"url":"{url}","ts":{ts},"duration_ms":{duration}}}'
            ).encode()
        else:
            kind = min(int(r / per_kind), last_kind)
            yield key, _invalid(kind, rng, user=user, url=url, ts=ts, duration=duration)
