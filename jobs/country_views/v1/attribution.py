"""The per-user state of country_views: which country a user is in, and how many views they
made; changes to either become signed changes of the per-country totals."""

from __future__ import annotations

from collections import defaultdict

from pyspark.sql.streaming import StatefulProcessor

UNKNOWN = "unknown"
OUTPUT = "country string, views bigint, users bigint"


def attribute_views(pageviews, profiles):
    from pyspark.sql import functions as F

    views = pageviews.select(
        F.col("user_id"), F.lit(None).cast("string").alias("country"),
        F.lit(False).alias("is_profile"), F.lit(False).alias("deleted"), F.col("kafka_offset"))
    # A tombstone has no fields: the record key is the user id.
    changes = profiles.select(
        F.col("kafka_key").try_cast("bigint").alias("user_id"),
        F.col("address.country").alias("country"), F.lit(True).alias("is_profile"),
        F.col("user_id").isNull().alias("deleted"), F.col("kafka_offset"))
    both = views.unionByName(changes).where(F.col("user_id").isNotNull())
    return both.groupBy("user_id").transformWithStateInPandas(
        statefulProcessor=Attribution(), outputStructType=OUTPUT, outputMode="Update",
        timeMode="None")


class Attribution(StatefulProcessor):
    def init(self, handle):
        self.user = handle.getValueState("user", "country string, views bigint")

    def handleInputRows(self, key, rows, timerValues):
        import pandas as pd

        batch = pd.concat(list(rows), ignore_index=True)
        country, views = self.user.get() if self.user.exists() else (None, 0)
        deltas = defaultdict(lambda: [0, 0])  # country -> [views, users]
        # Profile changes in log order; this batch's views are counted after them. At rest it
        # makes no difference: every view ends up with the user's latest country.
        for change in batch[batch["is_profile"]].sort_values("kafka_offset").itertuples():
            new = None if change.deleted else change.country
            deltas[country or UNKNOWN][0] -= views
            deltas[new or UNKNOWN][0] += views
            if country is not None:
                deltas[country][1] -= 1
            if new is not None:
                deltas[new][1] += 1
            country = new
        viewed = int((~batch["is_profile"]).sum())
        if viewed:
            deltas[country or UNKNOWN][0] += viewed
            deltas[UNKNOWN][0] += 0  # the "unknown" row exists once anything was viewed
            views += viewed
        self.user.update((country, views))
        yield pd.DataFrame(
            [(c, v, u) for c, (v, u) in deltas.items()], columns=["country", "views", "users"]
        ).astype({"views": "int64", "users": "int64"})

    def close(self):
        pass
