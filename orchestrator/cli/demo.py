"""`kappa demo`: the Kappa reprocessing story on the embedded default."""

from __future__ import annotations

from orchestrator.cli.output import ProgressBar, print_json, status_table, table
from orchestrator.settings import Settings

TOPIC = "pageviews"
JOBS = ("jobs/pageview_counts/v1.py", "jobs/pageview_counts/v2.py")


def run_demo(settings: Settings, count: int, as_json: bool) -> int:
    from dataclasses import replace
    from pathlib import Path

    from orchestrator.demo import top_urls, topic_size
    from orchestrator.service import Orchestrator

    def say(text: str) -> None:
        if not as_json:
            print(text, flush=True)

    if not (settings.pg_dsn and settings.kafka_bootstrap):
        from orchestrator.dev import stack

        say("1. Starting the embedded PostgreSQL and Kafka-protocol broker (kappa dev up)")
        started = stack.up(settings.state_dir)
        settings = replace(settings, pg_dsn=started.pg_dsn,
                           kafka_bootstrap=started.kafka_bootstrap)
    else:
        say("1. Using the configured PostgreSQL and Kafka")
    service = Orchestrator(settings)
    assert settings.kafka_bootstrap is not None
    have = topic_size(settings.kafka_bootstrap, TOPIC)
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
            service.wait(st.job, st.version, timeout_s=900,
                         progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()
    statuses = service.status("pageview_counts")
    tops = {st.version: top_urls(settings, st.output_table) for st in statuses}
    if as_json:
        print_json({"versions": [s.to_json() for s in statuses], "top_urls": tops})
        return 0
    for version, rows in tops.items():
        print(f"\nTop URLs in {version}:")
        print(table(["url", "views", "total duration ms"], rows))
    print("\nBoth versions, side by side (lag = records behind the log end):")
    print(status_table(statuses))
    from orchestrator.cli.lag import render

    print("\nTheir lag has gone to zero (`kappa lag --watch` follows it live):")
    print(render(service.lag("pageview_counts"), partitions=False))
    print("\nBoth drivers keep running live: `kappa produce-sample --count 1000 --seed 9` and "
          "`kappa status` show them catch up; `kappa dev down` stops them and the stack.")
    return 0
