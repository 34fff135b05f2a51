"""The latest profile of every user, from the changelog topic `profiles`; a tombstone deletes it.

The record key is the user id (a tombstone has nothing else). Each user's records sit in one
partition, in order, so the latest is the one with the highest Kafka offset: Spark keeps it per
user as state, and the output row replaces the user's row, or deletes it after a tombstone.
"""

NAME = "user_profiles"
VERSION = "v1"
MODE = "stream"
TOPICS = ["profiles"]
EVENT_SCHEMA = ("user_id bigint, plan string, address struct<country: string, city: string>, "
                "tags array<string>, updated_at timestamp")
TOMBSTONES = "pass"  # a null value reaches transform() as a row whose event fields are null
KEY_COLUMNS = ["user_id"]
OUTPUT_SCHEMA = {"user_id": "bigint", "plan": "text", "country": "text", "city": "text",
                 "tags": "jsonb", "updated_at": "timestamptz"}


def transform(events):
    from pyspark.sql import functions as F

    latest = (
        events.withColumn("key_user", F.col("kafka_key").try_cast("bigint"))
        .where(F.col("key_user").isNotNull())
        .groupBy("key_user")
        .agg(F.max_by(F.struct("user_id", "plan", "address", "tags", "updated_at"),
                      "kafka_offset").alias("p"))
    )
    return latest.select(
        F.col("key_user").alias("user_id"), F.col("p.plan").alias("plan"),
        F.col("p.address.country").alias("country"), F.col("p.address.city").alias("city"),
        F.col("p.tags").alias("tags"), F.col("p.updated_at").alias("updated_at"),
        F.col("p.user_id").isNull().alias("_delete"),  # the latest record is a tombstone
    )
