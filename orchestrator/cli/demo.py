"""`kappa demo`: the Kappa reprocessing story on the embedded default."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.cli.output import ProgressBar, print_json, status_table, table
from orchestrator.settings import Settings

TOPIC = "pageviews"
JOBS = ("jobs/pageview_counts/v1.py", "jobs/pageview_counts/v2.py")


def run_demo(settings: Settings, count: int, as_json: bool) -> int:
    from dataclasses import replace
    from pathlib import Path

    from orchestrator.samples.demo import top_urls, topic_size
    from orchestrator.service import Orchestrator

    def say(text: str) -> None:
        if not as_json:
            print(text, flush=True)

    if not (settings.pg_dsn and settings.kafka_bootstrap):
        from orchestrator.dev import stack

        say("1. Starting the embedded PostgreSQL and Kafka-protocol broker (kappa dev up)")
        from orchestrator.cli.dev import restore_into

        started = stack.up(settings.state_dir, restore=restore_into(settings, as_json))
        settings = replace(settings, pg_dsn=started.pg_dsn,
                           kafka_bootstrap=started.kafka_bootstrap)
    else:
        say("1. Using the configured PostgreSQL and Kafka")
    service = Orchestrator(settings)
    assert settings.kafka_bootstrap is not None
    have = topic_size(settings.kafka, TOPIC)
    if have < count:
        say(f"2. Producing {count - have:,} sample page views to '{TOPIC}'")
        service.produce_sample(TOPIC, count - have, seed=have + 1)
    else:
        say(f"2. Topic '{TOPIC}' already holds {have:,} events")
    root = Path(__file__).resolve().parents[2]
    for step, job_file in enumerate(JOBS, start=3):
        path = job_file if Path(job_file).exists() else root / job_file
        result = service.deploy(path)
        st = result.status
        say(f"{step}. Deploying {st.job} {st.version} -> {st.output_table} (replay from offset 0"
            f"{'' if result.created else ', already deployed'})")
        bar = None if as_json else ProgressBar(f"   {st.job} {st.version}")
        try:
            if st.state.value != "retired":  # by an earlier run of the demo
                service.wait(st.job, st.version, timeout_s=900,
                             progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()
    statuses = service.status("pageview_counts")
    tops = {st.version: top_urls(settings, st.output_table) for st in statuses}
    if not as_json:
        for version, rows in tops.items():
            print(f"\nTop URLs in {version}:")
            print(table(["url", "views", "total duration ms"], rows))
        print("\nBoth versions, side by side (lag = records behind the log end):")
        print(status_table(statuses))
        from orchestrator.cli.lag import render

        print("\nTheir lag has gone to zero (`kappa lag --watch` follows it live):")
        print(render(service.lag("pageview_counts"), partitions=False))
    story = _cutover_story(service, say)
    if as_json:
        print_json({"versions": [s.to_json() for s in service.status("pageview_counts")],
                    "top_urls": tops, "cutover": story})
        return 0
    print("\nEvery switch, as `kappa history pageview_counts` shows it:")
    print(table(["when", "who", "action", "from", "to", "percent", "reason"],
                [[h["at"], h["who"], h["action"], h["from"], h["to"], h["percent"], h["reason"]]
                 for h in service.history("pageview_counts")]))
    print("\nv2 keeps running live behind serving.pageview_counts; `kappa dev down` stops it "
          "and the stack.")
    return 0


def _cutover_story(service: Any, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Validate, A/B at 10 %, promote v2, roll back to v1, promote again, retire v1."""
    job = "pageview_counts"
    done: list[dict[str, Any]] = []
    if service.history(job):
        say("\nThe cutover story has been told in this directory already: "
            "`kappa history pageview_counts`")
        return done
    # v1 declares no guardrails, so no validation of it can pass: the first version is served
    # with --force, and the history records why.
    alias = service.promote(job, "v1", force=True,
                            reason="demo: the first version; nothing was served before")
    say(f"\n5. {alias['alias']} now serves v1 (readers query only this name)")
    done.append({"step": "promote v1", **alias})
    report = service.diff(job, "v1", "v2")
    say(f"6. kappa diff {job} v1 v2: {report.only_in_a} keys only in v1, "
        f"{report.only_in_b} only in v2, {report.differing.get('views', 0)} with other counts; "
        f"aligned at the same offsets: {report.aligned}; guardrails "
        + ", ".join(f"{g.name!r} {'passed' if g.passed else 'FAILED'}"
                    for g in report.guardrails))
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("7. A/B: 10 % of the URLs from v2", lambda: service.ab(job, "v2", 10,
                                                                reason="demo: A/B 10 %")),
        ("8. promote v2", lambda: service.promote(job, "v2", reason="demo: v2 validated")),
        ("9. roll back to v1 (one step; v1 kept running, so its data is current)",
         lambda: service.rollback(job, reason="demo: rollback")),
        ("10. promote v2 again", lambda: service.promote(job, "v2", reason="demo: again")),
    ]
    for text, action in steps:
        result = action()
        say(f"{text}: primary {result['primary']}, candidate {result['candidate']}, "
            f"{result['percent']} %")
        done.append({"step": text, **result})
    retired = service.retire(job, "v1")
    say("11. retire v1: its driver is stopped; its table stays until `kappa retire --drop`")
    done.append({"step": "retire v1", **retired})
    return done
