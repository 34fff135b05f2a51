"""`kappa archive run|status|verify|restore|decodings|prune-decoded`: the columnar copy of the
logs that jobs read, and its decoded segments."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from orchestrator.archive_model.segments import RetentionRisk
from orchestrator.cli.output import print_json, table


def add_archive_parser(sub: Any) -> None:
    a = sub.add_parser("archive", help="the archive of the log: Parquet segments of every topic "
                       "a deployed job reads")
    actions = a.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("run", "copy the logs into segments, every --interval seconds"),
                       ("status", "per partition: archived range, log range, records behind"),
                       ("verify", "read every segment back against the manifest and the log"),
                       ("restore", "write archived topics the broker lost back into it, with "
                        "the same offsets (`kappa dev up` does this)")):
        action = actions.add_parser(name, help=text)
        action.add_argument("topics", nargs="*", metavar="TOPIC",
                            help="the topics (default: every topic a deployed job reads)")
        action.add_argument("--json", action="store_true", help="print JSON, for scripts")
        if name == "verify":
            action.add_argument(
                "--decoded", nargs="?", type=int, const=0, default=None, metavar="N",
                help="also decode the decoded segments again from their raw segments and "
                "compare them row for row: all of them, or N spread over them")
        if name == "run":
            action.add_argument("--once", action="store_true", help="one pass up to the log end")
            action.add_argument("--interval", type=float, default=5.0,
                                help="seconds between passes")
            action.add_argument("--all-topics", action="store_true",
                                help="every topic of the broker, not only those jobs read")
    listed = actions.add_parser("decodings", help="per decoding and lineage: segments decoded "
                                "of those archived, and whether a version reads them")
    listed.add_argument("--json", action="store_true", help="print JSON, for scripts")
    prune = actions.add_parser("prune-decoded", help="remove the decoded segments that no "
                               "version reads any more")
    prune.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    prune.add_argument("--json", action="store_true", help="print JSON, for scripts")


def run_archive(service: Any, args: argparse.Namespace) -> int:
    if args.action == "status":
        rows = service.archive_status(args.topics)
        if args.json:
            print_json([_row_json(r) for r in rows])
        else:
            print(table(["topic", "partition", "lineage", "archived", "log", "behind",
                         "behind (s)", "retention", "noted end", "segments", "records",
                         "gaps", "bytes"],
                        [[r.topic, r.partition, _text(r.lineage, r.current),
                          _range(r.archived_first, r.archived_end),
                          _range(r.log_start, r.log_end), _unknown(r.behind),
                          "unknown" if r.lag_seconds is None else f"{r.lag_seconds:.1f}",
                          _retention(r),
                          "-" if r.noted_end is None else f"{r.noted_end:,}", r.segments,
                          r.records, r.gaps, r.bytes] for r in rows])
                  if rows else "nothing archived yet: `kappa archive run`")
            for topic, error in sorted({(r.topic, r.error) for r in rows if r.error}):
                print(f"{topic}: the archiver's passes stop on it: {error}")
            decodings = service.archive_decodings()
            if decodings:
                print(_decodings_table(decodings))
        return 0
    if args.action in ("decodings", "prune-decoded"):
        found = service.archive_decodings(prune=args.action == "prune-decoded",
                                          dry_run=getattr(args, "dry_run", False))
        if args.json:
            print_json([_decoding_json(p) for p in found])
        elif args.action == "prune-decoded" and not found:
            print("every decoded segment is read by a version: nothing to remove")
        else:
            if args.action == "prune-decoded":
                print("would remove:" if args.dry_run else "removed:")
            print(_decodings_table(found) if found else
                  "no decoded segments: deploy a version, then `kappa archive run`")
        return 0
    if args.action == "verify":
        report = service.archive_verify(args.topics, args.decoded)
        again = report.redecoded
        if args.json:
            print_json({"segments": report.segments, "compared_with_log": report.compared,
                        "records_compared": report.records, "decoded_segments": report.decoded,
                        "decoded_rebuilt": list(report.rebuilt),
                        "decoded_again": None if again is None else {
                            "compared": again.compared, "other_code": again.other_code,
                            "differed": list(again.differed)}})
        else:
            print(f"{report.segments:,} segments match their checksums; {report.compared:,} of "
                  f"them ({report.records:,} records) match the log the broker still holds; "
                  f"{report.decoded:,} decoded segments checked, {len(report.rebuilt):,} rebuilt")
            if again is not None:
                print(f"{again.compared:,} decoded segments decoded again and compared row for "
                      f"row, {len(again.differed):,} differed; {again.other_code:,} of older "
                      "parser code not compared")
        for line in () if again is None else again.differed:
            print(f"{line}: the decoder wrote what the parser does not make; report it",
                  file=sys.stderr)
        return 1 if again is not None and again.differed else 0
    if args.action == "restore":
        return _restore(service.archive_restore(args.topics), as_json=args.json)
    stopping = threading.Event()
    if not args.once:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.set())

    def said(segment: Any) -> None:
        if not args.json:
            print(f"archived {segment.lineage.topic}/{segment.partition} "
                  f"[{segment.first_offset}, {segment.end_offset}): {segment.records:,} "
                  f"records, {len(segment.gap_offsets):,} gaps, {segment.bytes:,} bytes",
                  flush=True)

    written = service.archive(args.topics, once=args.once, interval_s=args.interval,
                              on_segment=said, stop=stopping.is_set,
                              all_topics=args.all_topics)
    if args.json:
        print_json({"segments_written": written})
    return 0


def _restore(report: Any, *, as_json: bool) -> int:
    if as_json:
        print_json(restore_json(report))
    else:
        print_restore(report)
    return 0


def print_restore(report: Any, *, quiet_if_nothing: bool = False) -> None:
    for t in report.restored:
        print(f"restored {t.topic}: {t.records:,} records and {t.gaps:,} gaps at their "
              f"offsets (lineage {t.root.cluster_id}-{t.root.topic_id})")
    for topic in () if quiet_if_nothing else report.kept:
        print(f"{topic}: the broker holds it; nothing to restore")
    for topic in report.ended:
        print(f"{topic}: deleted on the broker before it was lost; not restored")
    for lost in report.lost:
        print(f"LOST {lost.describe()}: acknowledged by the broker, gone before it was "
              "archived")
    for failed in report.failed_versions:
        print(f"failed {failed}")
    for job, version in report.continuing:
        print(f"{job} {version} goes on from its offsets on the restored log (restarted)")
    if not report.restored and not report.kept and not report.ended and not quiet_if_nothing:
        print("nothing archived yet: nothing to restore")


def restore_json(report: Any) -> dict[str, Any]:
    return {"restored": [{"topic": t.topic, "lineage": f"{t.root.cluster_id}-{t.root.topic_id}",
                          "topic_id": t.topic_id, "records": t.records, "gaps": t.gaps,
                          "ends": {str(p): e for p, e in sorted(t.ends.items())}}
                         for t in report.restored],
            "kept": list(report.kept), "ended": list(report.ended),
            "lost": [{"topic": r.topic, "partition": r.partition, "first_offset": r.first_offset,
                      "end_offset": r.end_offset} for r in report.lost],
            "failed_versions": list(report.failed_versions),
            "continuing": [f"{job}/{version}" for job, version in report.continuing]}


def _row_json(r: Any) -> dict[str, Any]:
    return {"topic": r.topic, "partition": r.partition, "lineage": r.lineage,
            "current": r.current, "archived_first": r.archived_first,
            "archived_end": r.archived_end, "log_start": r.log_start, "log_end": r.log_end,
            "behind": r.behind, "lag_seconds": r.lag_seconds, "segments": r.segments,
            "records": r.records, "gaps": r.gaps, "bytes": r.bytes, "noted_end": r.noted_end,
            "retention": None if r.retention is None else r.retention.value,
            "retention_headroom": r.retention_headroom,
            "retention_headroom_share": r.retention_headroom_share, "error": r.error}


def _retention(r: Any) -> str:
    """ok, at_risk with the records left before retention takes unarchived ones, or lost with
    the records it took; "-" for an earlier lineage."""
    risk = r.retention
    if risk is None:
        return "-" if r.current is False else "unknown"
    if risk is RetentionRisk.AT_RISK:
        return f"{risk.value} ({r.retention_headroom:,} left)"
    if risk is RetentionRisk.LOST:
        return f"{risk.value} ({-r.retention_headroom:,} records)"
    return str(risk.value)


def _range(first: int | None, end: int | None) -> str:
    return "-" if first is None or end is None else f"[{first:,}, {end:,})"


def _unknown(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def _text(lineage: str | None, current: bool | None) -> str:
    if lineage is None:
        return "-"
    return lineage + ("" if current is not False else " (gone)")


def _decodings_table(found: list[Any]) -> str:
    return table(["topic", "lineage", "decoding", "read by a version", "decoded", "rows",
                  "dead letters", "bytes"],
                 [[p.topic, p.lineage, p.decoding, "yes" if p.in_use else "no",
                   f"{p.decoded_segments:,} of {p.raw_segments:,} segments", p.rows,
                   p.dead_letters, p.bytes] for p in found])


def _decoding_json(p: Any) -> dict[str, Any]:
    return {"topic": p.topic, "lineage": p.lineage, "decoding": p.decoding, "in_use": p.in_use,
            "raw_segments": p.raw_segments, "decoded_segments": p.decoded_segments,
            "pending_segments": p.pending, "rows": p.rows, "dead_letters": p.dead_letters,
            "bytes": p.bytes}
