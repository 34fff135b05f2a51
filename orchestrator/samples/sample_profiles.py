"""A deterministic sample changelog of user profiles: creates, updates, tombstones, dead letters.

``sample_profiles(count, seed, *, users=5000, invalid_share=0.001, horizon=None)`` yields
``count`` ``(key, value)`` pairs for a compacted, keyed topic: key = ``str(user_id).encode()``
(ASCII digits, user_id in ``1..users``), value = ``bytes`` (compact JSON, or not JSON at all for
an invalid event) or ``None`` (a tombstone: the user is deleted). The same (count, seed, users,
invalid_share) always gives the same events. A run with a smaller ``count`` is a prefix of a
longer one when both are planned for the same stream length: pass the longer run's count as
``horizon`` to the shorter one (see "Creates" below; without ``horizon`` the plan is ``count``,
so runs of different lengths share a prefix only while both counts are at most ``users``).

Valid value, exactly these five fields in this order, no whitespace::

    {"user_id":7,"plan":"pro","address":{"country":"DE","city":"Berlin"},
     "tags":["beta","vip"],"updated_at":"2024-01-01T00:00:01.234Z"}

- ``user_id``: JSON integer, equal to ``int(key)``;
- ``plan``: string, one of ``PLANS``;
- ``address``: object with exactly ``country`` (string, a key of ``COUNTRIES``, ISO 3166-1
  alpha-2) and ``city`` (string, one of ``COUNTRIES[country]``), in that order;
- ``tags``: array of 0 to 3 distinct strings from ``TAGS``, in ``TAGS`` order;
- ``updated_at``: string ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (UTC, always 3 digits of milliseconds),
  from ``BASE_UPDATED_AT_MS`` on, strictly increasing over the stream (every event, valid or
  not, moves the clock on by 1 to ``MAX_STEP_MS`` ms). Strings are plain ASCII: no escapes.

Creates: user ids are taken in the order of a seeded permutation of ``1..users``. Each event
takes the next new id with probability ``min(1, users / horizon)`` (``horizon`` defaults to
``count``; always while no user has been created yet), until every id is taken. Otherwise it
picks a user created before, uniformly (deleted ones included), and updates it
(``UPDATE_SHARE``, 88 %) or writes its tombstone (12 %; a deleted user may get another). An
update of a live user changes one of plan, address or tags (and ``updated_at``); an update of
a deleted user re-creates it with a new profile. With ``users >= count`` every event takes a
new id, so all ``count`` keys are distinct. (Should invalid events use up every id before any
user exists, a create takes a uniformly random id instead.) The latest state of a user is its
last valid event: a profile, or nothing after a tombstone.

Invalid events (dead letters): about ``invalid_share`` of all events, a third of it for each of
``INVALID_KINDS``. An invalid event has the key of the user its operation was about (a real id
in ``1..users``), but changes nothing about that user: a consumer must skip it. An invalid
event in place of a create still uses up that id, which is then never created (so keys stay
distinct when ``users >= count``). Checked in this order:

- ``not_json``: plain text or truncated JSON (never empty, never ``None``);
- ``missing_field``: valid JSON object, but ``address`` lacks ``country`` or ``city``, or one of
  the five top-level fields is absent;
- ``wrong_type``: all fields present, one of the wrong JSON type: ``user_id`` a string
  (``"7"``) or a boolean, ``plan`` a number, ``address`` a string, ``address.country`` or
  ``address.city`` a number, ``tags`` a string, a number inside ``tags`` (``["beta",3]``),
  ``updated_at`` an epoch-ms number.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from itertools import combinations

from orchestrator.errors import KappaError
from orchestrator.samples.sample import check_share, check_users

__all__ = [
    "BASE_UPDATED_AT_MS",
    "COUNTRIES",
    "FIELDS",
    "INVALID_KINDS",
    "INVALID_SHARE",
    "MAX_STEP_MS",
    "PLANS",
    "TAGS",
    "UPDATE_SHARE",
    "USERS",
    "sample_profiles",
]

FIELDS = ("user_id", "plan", "address", "tags", "updated_at")
INVALID_KINDS = ("not_json", "missing_field", "wrong_type")
INVALID_SHARE = 0.001  # default share of invalid events, all kinds together
USERS = 5_000
UPDATE_SHARE = 0.88  # of the events on an existing user; the rest are tombstones
BASE_UPDATED_AT_MS = 1_704_067_200_000  # 2024-01-01T00:00:00.000Z
MAX_STEP_MS = 100  # updated_at moves on by 1..MAX_STEP_MS ms per event
PLANS = ("free", "pro", "team", "enterprise")
COUNTRIES: dict[str, tuple[str, ...]] = {
    "DE": ("Berlin", "Hamburg", "Munich"),
    "FR": ("Paris", "Lyon", "Marseille"),
    "GB": ("London", "Manchester"),
    "US": ("New York", "Chicago", "Austin"),
    "JP": ("Tokyo", "Osaka"),
    "BR": ("Sao Paulo", "Rio de Janeiro"),
    "IN": ("Mumbai", "Bangalore", "Delhi"),
    "CA": ("Toronto", "Vancouver"),
    "AU": ("Sydney", "Melbourne"),
    "ES": ("Madrid", "Barcelona", "Valencia"),
    "IT": ("Rome", "Milan"),
    "NL": ("Amsterdam", "Rotterdam", "Utrecht"),
}
TAGS = ("beta", "vip", "newsletter", "mobile", "trial", "churn-risk", "partner", "staff")

# Precomputed JSON fragments; a profile's state is (plan index, address index, tags index).
_PLAN_PICK = (0, 0, 0, 0, 0, 1, 1, 1, 2, 3)  # free is the most common plan
_PLANS_JSON = tuple(f'"{p}"' for p in PLANS)
_ADDRESSES = tuple((c, city) for c, cities in COUNTRIES.items() for city in cities)
_ADDRESSES_JSON = tuple(f'{{"country":"{c}","city":"{city}"}}' for c, city in _ADDRESSES)
_TAG_SETS = tuple(s for k in range(4) for s in combinations(TAGS, k))
_TAG_SETS_JSON = tuple("[" + ",".join(f'"{t}"' for t in s) + "]" for s in _TAG_SETS)
_TAG_SETS_BY_SIZE = tuple(
    tuple(i for i, s in enumerate(_TAG_SETS) if len(s) == k) for k in range(4)
)
_TAG_SIZE_PICK = (0, 0, 0, 1, 1, 1, 1, 2, 2, 3)
_MS_SUFFIXES = tuple(f".{ms:03d}Z" for ms in range(1000))

for _text in (*PLANS, *COUNTRIES, *(c for cs in COUNTRIES.values() for c in cs), *TAGS):
    if not _text.isascii() or '"' in _text or "\\" in _text:  # values are formatted, not dumped
        raise ValueError(f"sample profile text {_text!r} would need JSON escaping")

_State = tuple[int, int, int]
_Rand = Callable[[], float]


def sample_profiles(
    count: int,
    seed: int,
    *,
    users: int = USERS,
    invalid_share: float = INVALID_SHARE,
    horizon: int | None = None,
) -> Iterator[tuple[bytes, bytes | None]]:
    """Yield ``count`` deterministic profile changes (key, JSON value or None) for ``seed``.

    ``users``: ids are ``1..users``; ``invalid_share`` in [0, 1): share of dead letters;
    ``horizon``: the stream length the create rate is planned for (default ``count``). Bad
    arguments raise a one-line KappaError here, before the first event.
    """
    check_users(users)
    share = check_share(invalid_share)
    if horizon is not None and (
        isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1
    ):
        raise KappaError(f"horizon must be a whole number >= 1, not {horizon!r}")
    plan = count if horizon is None else horizon
    p_new = 1.0 if plan <= 0 else min(1.0, users / plan)
    return _changes(count, seed, users, share, p_new)


def _changes(
    count: int, seed: int, users: int, share: float, p_new: float
) -> Iterator[tuple[bytes, bytes | None]]:
    rng = random.Random(seed)
    rand = rng.random
    per_kind = share / len(INVALID_KINDS)
    last_kind = len(INVALID_KINDS) - 1
    plans_json, addresses_json, tags_json = _PLANS_JSON, _ADDRESSES_JSON, _TAG_SETS_JSON
    n_plans, n_addresses = len(PLANS), len(_ADDRESSES)
    swapped: dict[int, int] = {}  # lazy Fisher-Yates: position -> id, where not position + 1
    taken = 0  # ids taken from the permutation so far
    existing: list[tuple[int, bytes]] = []  # (id, key) of every user created, in order
    live: dict[int, _State] = {}
    update_share, suffixes = UPDATE_SHARE, _MS_SUFFIXES
    ms = BASE_UPDATED_AT_MS
    second, prefix = -1, ""
    for _ in range(count):
        r = rand()
        ms += 1 + int(rand() * MAX_STEP_MS)
        if ms // 1000 != second:
            second = ms // 1000
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        stamp = prefix + suffixes[ms % 1000]
        n_existing = len(existing)
        create = not n_existing or (taken < users and rand() < p_new)
        if create:
            if taken < users:
                j = taken + int(rand() * (users - taken))
                user = swapped.get(j, j + 1)
                moved = swapped.pop(taken, taken + 1)  # position `taken` is never read again
                if j != taken:
                    swapped[j] = moved
                taken += 1
            else:  # nobody was ever created (every create was invalid) and no id is left
                user = 1 + int(rand() * users)
            key = str(user).encode()
            update = True
        else:
            user, key = existing[int(rand() * n_existing)]
            update = rand() < update_share
        if r < share:
            yield key, _invalid(min(int(r / per_kind), last_kind), rng, user, _fresh(rand), ms,
                                stamp)
            continue
        if not update:
            live.pop(user, None)
            yield key, None
            continue
        old = None if create else live.get(user)
        if old is None:
            state = _fresh(rand)
            if create:
                existing.append((user, key))
        else:
            p, a, t = old
            which = rand()
            if which < 0.4:
                p = (p + 1 + int(rand() * (n_plans - 1))) % n_plans
            elif which < 0.7:
                a = (a + 1 + int(rand() * (n_addresses - 1))) % n_addresses
            else:
                t = _pick_tags(rand)
            state = (p, a, t)
        live[user] = state
        p, a, t = state
        yield key, (
            f'{{"user_id":{user},"plan":{plans_json[p]},"address":{addresses_json[a]},'
            f'"tags":{tags_json[t]},"updated_at":"{stamp}"}}'
        ).encode()


def _pick_tags(rand: _Rand) -> int:
    group = _TAG_SETS_BY_SIZE[_TAG_SIZE_PICK[int(rand() * len(_TAG_SIZE_PICK))]]
    return group[int(rand() * len(group))]


def _fresh(rand: _Rand) -> _State:
    return (_PLAN_PICK[int(rand() * len(_PLAN_PICK))], int(rand() * len(_ADDRESSES)),
            _pick_tags(rand))


def _invalid(kind: int, rng: random.Random, user: int, state: _State, ms: int,
             stamp: str) -> bytes:
    """A dead letter of ``INVALID_KINDS[kind]`` built from ``state``."""
    p, a, t = state
    country, city = _ADDRESSES[a]
    fields = {
        "user_id": str(user),
        "plan": _PLANS_JSON[p],
        "address": _ADDRESSES_JSON[a],
        "tags": _TAG_SETS_JSON[t],
        "updated_at": f'"{stamp}"',
    }
    if kind == 0:  # not JSON
        if rng.random() < 0.4:
            return (b"not json", b"<html>502 Bad Gateway</html>", b"user=7;plan=pro")[
                rng.randrange(3)]
        full = "{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}"
        return full[: rng.randrange(1, len(full) - 1)].encode()  # never balanced
    pick = rng.randrange(8)
    if kind == 1:  # a missing field
        if pick < 3:
            fields["address"] = f'{{"city":"{city}"}}'
        elif pick < 5:
            fields["address"] = f'{{"country":"{country}"}}'
        else:
            del fields[FIELDS[rng.randrange(len(FIELDS))]]
    elif pick == 0:  # a wrong type, all fields present
        fields["user_id"] = f'"{user}"' if rng.random() < 0.7 else "true"
    elif pick == 1:
        fields["plan"] = str(p + 1)
    elif pick == 2:
        fields["address"] = f'"{country}/{city}"'
    elif pick == 3:
        fields["address"] = f'{{"country":{a % 7 + 1},"city":"{city}"}}'
    elif pick == 4:
        fields["address"] = f'{{"country":"{country}","city":{a + 100}}}'
    elif pick == 5:
        fields["tags"] = f'"{TAGS[t % len(TAGS)]}"'
    elif pick == 6:
        fields["tags"] = _TAG_SETS_JSON[t][:-1] + ("," if len(_TAG_SETS[t]) else "") + "3]"
    else:
        fields["updated_at"] = str(ms)
    return ("{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}").encode()
