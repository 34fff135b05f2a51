"""Page views per URL and how many came with a referrer, from Avro events in the schema
registry's wire format (`kappa produce-sample --format avro`). The log holds records of two
versions of the schema: the reader schema beside this file is the second, whose `referrer`
has a default, so the first version's records read with a null referrer. The events' fields
come from the reader schema: none is declared here (docs/formats.md)."""

NAME = "pageview_referrers"
VERSION = "v1"
TOPICS = ["pageviews_avro"]
EVENT_FORMAT = "avro"
EVENT_SCHEMA = "page_view.avsc"
NON_NEGATIVE = ["duration_ms"]
KEY_COLUMNS = ["url"]
OUTPUT_SCHEMA = {"url": "text", "views": "bigint", "referred": "bigint"}
MERGE = {"views": "sum", "referred": "sum"}


def transform(events):
    from pyspark.sql import functions as F

    return events.groupBy("url").agg(
        F.count(F.lit(1)).alias("views"),
        F.count("referrer").alias("referred"),
    )
