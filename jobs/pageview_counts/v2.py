"""Page views per URL after normalising the URL (the bug fix of v1).

Normalisation: lowercase; drop the query string and the fragment; drop one trailing "/" unless
the URL is "/".
"""

NAME = "pageview_counts"
VERSION = "v2"
TOPICS = ["pageviews"]
EVENT_SCHEMA = {"user_id": "long", "url": "string", "ts": "long", "duration_ms": "long"}
NON_NEGATIVE = ["duration_ms"]
KEY_COLUMNS = ["url"]
OUTPUT_SCHEMA = {"url": "text", "views": "bigint", "total_duration_ms": "bigint"}
MERGE = {"views": "sum", "total_duration_ms": "sum"}
# Checked by `kappa diff`: SQL returning one boolean; {this} is this version's table and {other}
# the table of the version it is compared with.
GUARDRAILS = {
    "no negative counts":
        "SELECT count(*) = 0 FROM {this} WHERE views < 0 OR total_duration_ms < 0",
    "total views within 1 % of the other version":
        "SELECT abs(t.v - o.v) <= 0.01 * greatest(o.v, 1) FROM "
        "(SELECT coalesce(sum(views), 0) AS v FROM {this}) t, "
        "(SELECT coalesce(sum(views), 0) AS v FROM {other}) o",
}


def transform(events):
    from pyspark.sql import functions as F

    # (?s): "." also matches a newline; \z: the very end (Java's "$" also matches before a final
    # newline). "(.)/" keeps a lone "/" as it is.
    path = F.regexp_replace(F.lower(F.col("url")), r"(?s)[?#].*\z", "")
    normalised = events.withColumn("url", F.regexp_replace(path, r"(?s)(.)/\z", "$1"))
    return normalised.groupBy("url").agg(
        F.count(F.lit(1)).alias("views"),
        F.sum("duration_ms").alias("total_duration_ms"),
    )

