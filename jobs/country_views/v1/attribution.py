"""The per-user state of country_views: which country a user is in, and how many views they
made; changes to either become signed changes of the per-country totals.

The state is kept with ``applyInPandasWithState``, which hands each user's state to the
function in-process with the user's rows: one call per user and batch, no round trip per
state access, so a batch touching thousands of users stays cheap.
"""

from __future__ import annotations

UNKNOWN = "unknown"
OUTPUT = "country string, views bigint, users bigint"
STATE = "country string, views bigint"


def attribute_views(pageviews, profiles):
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    views = pageviews.select(
        F.col("user_id"), F.lit(None).cast("string").alias("country"),
        F.lit(False).alias("is_profile"), F.lit(False).alias("deleted"), F.col("kafka_offset"))
    # A tombstone has no fields: the record key is the user id.
    changes = profiles.select(
        F.col("kafka_key").try_cast("bigint").alias("user_id"),
        F.col("address.country").alias("country"), F.lit(True).alias("is_profile"),
        F.col("user_id").isNull().alias("deleted"), F.col("kafka_offset"))
    both = views.unionByName(changes).where(F.col("user_id").isNotNull())
    return both.groupBy("user_id").applyInPandasWithState(
        attribute, outputStructType=OUTPUT, stateStructType=STATE, outputMode="update",
        timeoutConf=GroupStateTimeout.NoTimeout)


def attribute(key, batches, state):
    import pandas as pd

    country, views = state.get if state.exists else (None, 0)
    changes, viewed = [], 0
    for frame in batches:
        is_profile = frame["is_profile"].to_numpy()
        profiles = int(is_profile.sum())
        viewed += len(is_profile) - profiles
        if profiles:
            chosen = frame[is_profile]
            changes += zip(chosen["kafka_offset"].tolist(), chosen["deleted"].tolist(),
                           chosen["country"].tolist(), strict=True)
    deltas = {}  # country -> [views, users]

    def add(where, views_change, users_change):
        entry = deltas.setdefault(where, [0, 0])
        entry[0] += views_change
        entry[1] += users_change

    # Profile changes in log order; this batch's views are counted after them. At rest it
    # makes no difference: every view ends up with the user's latest country.
    for _, deleted, changed_to in sorted(changes):
        new = None if deleted else changed_to
        add(country or UNKNOWN, -views, -1 if country is not None else 0)
        add(new or UNKNOWN, views, 1 if new is not None else 0)
        country = new
    if viewed:
        add(country or UNKNOWN, viewed, 0)
        add(UNKNOWN, 0, 0)  # the "unknown" row exists once anything was viewed
        views += viewed
    state.update((country, int(views)))
    yield pd.DataFrame({"country": list(deltas), "views": [v for v, _ in deltas.values()],
                        "users": [u for _, u in deltas.values()]})
