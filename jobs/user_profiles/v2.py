"""v1 plus each user's region, derived from the country before the state is kept.

The derived column is part of the state, so v2's state differs from v1's: a new version starts
with empty state and replays the changelog from offset 0, which is the Kappa way to change a
state schema.
"""

NAME = "user_profiles"
VERSION = "v2"
MODE = "stream"
TOPICS = ["profiles"]
EVENT_SCHEMA = ("user_id bigint, plan string, address struct<country: string, city: string>, "
                "tags array<string>, updated_at timestamp")
TOMBSTONES = "pass"
KEY_COLUMNS = ["user_id"]
OUTPUT_SCHEMA = {"user_id": "bigint", "plan": "text", "country": "text", "city": "text",
                 "region": "text", "tags": "jsonb", "updated_at": "timestamptz"}
# Checked by `kappa diff` before v2 is served beside v1 or instead of it ({this}: v2's table,
# {other}: the served version's).
GUARDRAILS = {
    "the same users as the other version":
        "SELECT (SELECT count(*) FROM {this}) = (SELECT count(*) FROM {other})",
    "every user has a region": "SELECT count(*) = 0 FROM {this} WHERE region IS NULL",
}
REGIONS = {"DE": "EU", "FR": "EU", "ES": "EU", "IT": "EU", "NL": "EU", "PL": "EU", "SE": "EU",
           "GB": "EU", "US": "NA", "CA": "NA", "MX": "NA", "BR": "SA", "AR": "SA", "JP": "APAC",
           "IN": "APAC", "AU": "APAC", "CN": "APAC", "KR": "APAC", "SG": "APAC"}


def transform(events):
    from pyspark.sql import functions as F

    region = F.coalesce(
        F.create_map(*[F.lit(x) for pair in REGIONS.items() for x in pair])[
            F.col("address.country")],
        F.lit("other"))
    latest = (
        events.withColumn("key_user", F.col("kafka_key").try_cast("bigint"))
        .where(F.col("key_user").isNotNull())
        .withColumn("region", F.when(F.col("user_id").isNotNull(), region))
        .groupBy("key_user")
        .agg(F.max_by(F.struct("user_id", "plan", "address", "region", "tags", "updated_at"),
                      "kafka_offset").alias("p"))
    )
    return latest.select(
        F.col("key_user").alias("user_id"), F.col("p.plan").alias("plan"),
        F.col("p.address.country").alias("country"), F.col("p.address.city").alias("city"),
        F.col("p.region").alias("region"), F.col("p.tags").alias("tags"),
        F.col("p.updated_at").alias("updated_at"),
        F.col("p.user_id").isNull().alias("_delete"),
    )
