"""Page views per country of the viewer's profile: two topics, one stateful join.

Semantics, chosen so that the result at rest depends only on the two logs, not on how their
records interleave or where batches were cut:

- a user's country is the one in their latest profile (by offset in `profiles`); a tombstone,
  or no valid profile at all, leaves the user without one;
- every valid page view counts for its user's country *at rest*: when a profile moves to
  another country, the user's earlier views move with it;
- `views` is the number of valid page views of users whose country it is; page views of users
  without a country count under "unknown";
- `users` is the number of users whose latest profile names the country;
- there is a row for every country that any valid profile record ever named, and one for
  "unknown" as soon as there is any valid profile record or page view, even when its counts
  are zero: which keys exist must not depend on the interleaving either.

The state is kept per user (country, views) by `attribution.attribute`; it emits signed
changes per country, which the table sums (MERGE): a user who moves from DE to FR with 7 views
gives DE (-7 views, -1 user) and FR (+7, +1).
"""

NAME = "country_views"
VERSION = "v1"
MODE = "stream"
TOPICS = ["pageviews", "profiles"]
EVENT_SCHEMAS = {
    "pageviews": "user_id bigint, url string, ts bigint, duration_ms bigint",
    "profiles": "user_id bigint, plan string, address struct<country: string, city: string>, "
                "tags array<string>, updated_at timestamp",
}
NON_NEGATIVE = {"pageviews": ["duration_ms"]}
TOMBSTONES = {"profiles": "pass"}
KEY_COLUMNS = ["country"]
OUTPUT_SCHEMA = {"country": "text", "views": "bigint", "users": "bigint"}
MERGE = {"views": "sum", "users": "sum"}


def transform(events):
    from .attribution import attribute_views

    return attribute_views(events["pageviews"], events["profiles"])
