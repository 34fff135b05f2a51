"""Distinct users per URL, with the first and last time a view of it was logged.

A stream job: the set of users seen per URL is Spark state, kept in this version's checkpoint,
so a user counts once however many batches their views are spread over. URLs are normalised as
in pageview_counts v2 (lowercase; no query string or fragment; one trailing "/" dropped unless
the URL is "/"). First and last seen are the Kafka timestamps of the URL's views, so a replay
gives the same values as the live run did.
"""

NAME = "url_visitors"
VERSION = "v1"
MODE = "stream"
TOPICS = ["pageviews"]
EVENT_SCHEMA = "user_id bigint, url string, ts bigint, duration_ms bigint"
NON_NEGATIVE = ["duration_ms"]
KEY_COLUMNS = ["url"]
OUTPUT_SCHEMA = {"url": "text", "visitors": "bigint", "first_seen": "timestamptz",
                 "last_seen": "timestamptz"}


def transform(events):
    from pyspark.sql import functions as F

    path = F.regexp_replace(F.lower(F.col("url")), r"(?s)[?#].*\z", "")
    url = F.regexp_replace(path, r"(?s)(.)/\z", "$1")
    return events.groupBy(url.alias("url")).agg(
        F.size(F.collect_set("user_id")).cast("bigint").alias("visitors"),
        F.min("kafka_timestamp").alias("first_seen"),
        F.max("kafka_timestamp").alias("last_seen"),
    )
