"""Page views per URL and how many came with a referrer, from Protobuf events in the schema
registry's wire format (`kappa produce-sample --format protobuf`). The log holds records of two
versions of `kappa.samples.PageView`: the descriptor set beside this file is the second's, whose
`optional string referrer` reads as null where the first version's records lack it (Protobuf
resolves by field number). The events' fields come from the message: none is declared here
(docs/formats.md). `page_view.desc` is what `protoc --descriptor_set_out` writes for
page_view.proto; orchestrator/samples/sample_protobuf.py builds the same bytes."""

NAME = "pageview_referrers_protobuf"
VERSION = "v1"
TOPICS = ["pageviews_protobuf"]
EVENT_FORMAT = "protobuf"
EVENT_SCHEMA = {"descriptor_set": "page_view.desc", "message": "kappa.samples.PageView"}
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
