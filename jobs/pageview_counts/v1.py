"""Page views and total view time per URL, exactly as the URL appears in the event."""

NAME = "pageview_counts"
VERSION = "v1"
TOPICS = ["pageviews"]
EVENT_SCHEMA = {"user_id": "long", "url": "string", "ts": "long", "duration_ms": "long"}
NON_NEGATIVE = ["duration_ms"]
KEY_COLUMNS = ["url"]
OUTPUT_SCHEMA = {"url": "text", "views": "bigint", "total_duration_ms": "bigint"}
# Each micro-batch's aggregates are added to what the table already holds.
MERGE = {"views": "sum", "total_duration_ms": "sum"}


def transform(events):
    from pyspark.sql import functions as F

    return events.groupBy("url").agg(
        F.count(F.lit(1)).alias("views"),
        F.sum("duration_ms").alias("total_duration_ms"),
    )
