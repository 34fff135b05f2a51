"""Cutover by outcome, end to end: an application reads `serving.pageview_counts` by key and
writes what its readers did into its own table; its true conversion rate depends on the version
that served the key (the alias's served_by column says which). `kappa cutover --strategy ab|
bandit` must promote a better candidate, roll back a worse one (the bandit exposing fewer
readers to it than a fixed split on the same traffic), roll back a guardrail that degrades, and
resume a killed run with the same statistics."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import ROOT, debian_tool, job_file, kappa_cli, wait_until
from integration.helpers import reap
from integration.outcome_readers import Application, create_outcomes_table

# One deployment for every test of the module, on one xdist worker (--dist loadgroup): a
# module fixture would deploy once per worker that runs one of them.
pytestmark = [pytest.mark.integration, pytest.mark.spark,
              pytest.mark.xdist_group("outcome_cutover")]
JOB = "pageview_counts"


@pytest.fixture(scope="module")
def deployed(stack, tmp_path_factory: pytest.TempPathFactory):
    """v1 and v2 caught up and validated, v1 served through an alias with a served_by column,
    the application's table, and the keys both versions have."""
    from orchestrator.service import Orchestrator
    from orchestrator.settings import Settings
    from orchestrator.spark.launch import launcher

    tag = uuid.uuid4().hex[:8]
    tmp = tmp_path_factory.mktemp("outcomes")
    settings = Settings(
        state_dir=tmp / "state", pg_dsn=stack.pg_dsn, kafka_bootstrap=stack.kafka_bootstrap,
        catalog_schema=f"kappa_{tag}", data_schema=f"data_{tag}",
        serving_schema=f"serving_{tag}", spark_driver_memory="768m", heartbeat_interval_s=1.0,
        alias_version_column="served_by", spare_dir=Path(stack.state_dir) / "spares")
    service = Orchestrator(settings)
    topic = f"pageviews_{tag}"
    service.produce_sample(topic, 4_000, seed=221)
    for version in ("v1", "v2"):
        service.deploy(job_file(tmp, version, topic))
    for version in ("v1", "v2"):
        service.wait(JOB, version, timeout_s=600)
    service.diff(JOB, "v1", "v2")
    service.promote(JOB, "v1", force=True, reason="outcome tests start on v1")
    schema = f"app_{tag}"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL(
            "CREATE TABLE {}.outcomes (key text NOT NULL, converted int NOT NULL, erred int "
            "NOT NULL, observed_at timestamptz NOT NULL DEFAULT clock_timestamp())").format(
            sql.Identifier(schema)))
        keys = [r[0] for r in conn.execute(sql.SQL(
            "SELECT url FROM {d}.{a} INTERSECT SELECT url FROM {d}.{b} ORDER BY 1").format(
            d=sql.Identifier(settings.data_schema), a=sql.Identifier(f"{JOB}__v1"),
            b=sql.Identifier(f"{JOB}__v2")))]
    assert len(keys) >= 50, keys
    for name, column, role in (("converts", "converted", "decision"),
                               ("errors", "erred", "guardrail")):
        defined = kappa_cli(settings, "metric", "define", JOB, name, "--sql",
                            f"SELECT key, {column} AS value, observed_at FROM {schema}.outcomes "
                            "WHERE observed_at >= {since}", "--kind", "proportion", "--better",
                            "higher" if name == "converts" else "lower", "--role", role,
                            *(["--margin", "0.5"] if role == "guardrail" else []))
        assert defined.returncode == 0, defined.stderr
    yield settings, service, schema, keys
    for st in service.status():
        if st.pid:
            launcher.terminate(st.pid, None, grace_s=2)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("outcome_scenarios")


@pytest.fixture(autouse=True)
def v1_serves_and_no_cutover_runs(deployed) -> None:
    """Every test starts where a team would: v1 serves every key and no cutover runs, whichever
    tests ran before it (the killed cutovers promote v2; a test that failed midway may have
    left its plan running, which a cutover of other arguments refuses to resume)."""
    service = deployed[1]
    service.abort_cutover(JOB, "v2", reason="the next test starts from v1")
    serving = service.serving(JOB)
    if serving.primary != "v1" or serving.candidate is not None:
        service.promote(JOB, "v1", force=True, reason="the next test starts from v1")
    serving = service.serving(JOB)
    assert serving.primary == "v1" and serving.candidate is None, serving


# Keys alike in every scenario but two: their history (--pre-period) would only cost each look
# a longer read. Those two give theirs.
FAST = ("--look-seconds", "0.5", "--min-per-arm", "200", "--mixture-sd", "0.2", "--pre-period",
        "0")


def _cutover(settings: Any, *args: str) -> tuple[int, dict[str, Any], str]:
    """Run `kappa cutover` to its end; (exit status, `kappa experiment --json`, stderr)."""
    done = kappa_cli(settings, "cutover", JOB, "v2", *FAST, *args)  # args override FAST
    found = json.loads(kappa_cli(settings, "experiment", JOB, "--json").stdout)
    return done.returncode, found, done.stderr


def _last(found: dict[str, Any], metric: str = "converts") -> dict[str, Any]:
    (evidence,) = [m for m in found["looks"][-1]["evidence"]["metrics"] if m["metric"] == metric]
    return evidence


def _run(deployed, converts: dict[str, float], errors: dict[str, float], seed: int,
         *args: str) -> tuple[int, dict[str, Any], str, Application]:
    settings, service, schema, keys = deployed
    app = Application(settings, schema, keys, converts, errors, seed=seed)
    app.start()
    try:
        status, found, stderr = _cutover(settings, *args)
    finally:
        app.stop()
    assert service.serving(JOB) is not None
    return status, found, stderr, app


def test_bad_cutover_flags_and_unknown_metrics_switch_nothing(deployed) -> None:
    settings, service, _, _ = deployed
    before = service.history(JOB)
    for args, says in [
            (("--strategy", "bandit", "--metric", "converts", "--min-percent", "60",
              "--max-percent", "40", "--start-percent", "50"),
             "--min-percent (60) and --max-percent (40)"),
            (("--strategy", "ab", "--metric", "nothing_like_it"), "no outcome metric"),
            (("--strategy", "ab", "--metric", "errors"), "needs a decision metric"),
            (("--metric", "converts"), "add --strategy ab"),
    ]:
        refused = kappa_cli(settings, "cutover", JOB, "v2", *args)
        assert refused.returncode == 1 and says in refused.stderr, (args, refused.stderr)
        assert refused.stderr.count("\n") == 1, refused.stderr
    assert service.history(JOB) == before


def test_a_worse_candidate_is_rolled_back_on_its_evidence_and_the_bandit_exposes_fewer_readers(
        deployed) -> None:
    service = deployed[1]
    worse = {"v1": 0.30, "v2": 0.24}  # 20 % worse, relative
    same_errors = {"v1": 0.05, "v2": 0.05}
    exposed, share = {}, {}
    earlier = len(service.history(JOB))
    for strategy in ("ab", "bandit"):
        # No decision below 600 readers on each arm. The deadline only bounds a hang: a
        # rollback there (the policy's default) is not the evidence this test is about. With
        # --min-percent 1 and --max-duration 30 the bandit starved the candidate's arm of the
        # 600 and rolled back at the deadline in 97 % of simulated runs (simulation.py), as it
        # did here. Simulated with this design at 75-200 readers a look (300 paired seeds),
        # both strategies rolled back on their evidence in every run, by look 208 (104 s).
        status, found, stderr, _ = _run(
            deployed, worse, same_errors, 17, "--strategy", strategy, "--metric", "converts",
            "--start-percent", "50", "--min-percent", "20", "--max-percent", "50",
            "--max-step", "25", "--max-duration", "600", "--min-per-arm", "600")
        assert status == 1 and "rolled back" in stderr, stderr
        assert found["status"] == "rolled_back" and found["verdict"] == "roll_back", found
        _rolled_back_on_its_evidence_before_the_deadline(found)
        evidence = _last(found)
        assert evidence["candidate"]["version"] == "v2"
        exposed[strategy] = evidence["candidate"]["count"]
        share[strategy] = exposed[strategy] / (exposed[strategy] + evidence["baseline"]["count"])
        assert service.serving(JOB).primary == "v1" and service.serving(JOB).candidate is None
    print(f"readers exposed to the worse candidate: {exposed}, of all readers: {share}")
    # Of the readers the test served, the bandit exposed fewer to the worse candidate than the
    # fixed split did (in all 300 paired simulations). Its total exposure until the decision
    # is smaller on average only (the stopping time varies: smaller in 83 % of single
    # paired runs), which the seeded simulations assert: tests/unit/test_outcome_by_key.py's
    # test_a_better_candidate_is_promoted_and_a_worse_one_costs_the_bandit_less.
    assert share["bandit"] < share["ab"], share
    steps = [(h["action"], h["percent"]) for h in service.history(JOB)[earlier:]]
    bandit = steps[steps.index(("ab", 50), steps.index(("ab", 50)) + 1):]
    assert any(action == "ab" and percent < 50 for action, percent in bandit), steps


def _rolled_back_on_its_evidence_before_the_deadline(found: dict[str, Any]) -> None:
    """Rolled back by the decision metric's evidence: not by the policy's default at
    --max-duration ("at the deadline: ...") nor for want of data ("no usable evidence")."""
    looks = found["looks"]
    assert looks[-1]["reason"] == "converts worse than the baseline", looks[-1]
    assert found["reason"].endswith(": converts worse than the baseline"), found["reason"]
    assert _last(found)["outcome"] in ("worse", "worse_beyond_margin"), _last(found)
    elapsed = (datetime.fromisoformat(str(looks[-1]["at"]))
               - datetime.fromisoformat(str(looks[0]["at"]))).total_seconds()
    assert elapsed < found["design"]["max_duration_s"], (elapsed, found["design"])


def test_a_guardrail_that_degrades_rolls_back_while_conversions_improve(deployed) -> None:
    status, found, stderr, _ = _run(
        deployed, {"v1": 0.30, "v2": 0.36}, {"v1": 0.05, "v2": 0.15}, 18, "--strategy", "ab",
        "--metric", "converts", "--metric", "errors", "--start-percent", "50")
    assert status == 1 and "guardrail errors" in stderr, stderr
    assert _last(found, "errors")["outcome"] == "worse_beyond_margin"
    assert _last(found, "converts")["outcome"] in ("better", "non_inferior", "undecided")


def _readers_of_keys_that_differ(deployed, converts: dict[str, float], seed: int
                                 ) -> Application:
    """Each URL converts at its own rate (Beta(2, 18), a mean of 10 %), times its serving
    version's factor; started, and read for about 9 s (3,600 readers) before the test, so
    that the test has each key's history (--pre-period 10)."""
    settings, _, schema, keys = deployed
    rng = random.Random(seed)
    rates = {key: rng.betavariate(2, 18) for key in keys}
    app = Application(settings, schema, keys, converts, {"v1": 0.05, "v2": 0.05}, seed=seed,
                      key_rates=rates)
    app.start()
    wait_until(lambda: sum(app.served.values()) >= 3_600, 180, "readers before the test")
    return app


def test_keys_that_differ_call_no_difference_in_an_a_a_test(deployed) -> None:
    """The issue's A/A test: both versions convert each key alike, keys differ. Counting
    observations as units promoted v2 at its second look; with the key as the unit the test
    runs to its --max-duration without calling a difference."""
    settings, service, _, _ = deployed
    # At alpha 0.001, so that this one run cannot call a difference by chance: at the default
    # 0.05 an A/A test decides falsely in up to alpha of runs (3 in 300 simulated runs of this
    # design by key, none at 0.001). The error rates at 0.05 are the seeded simulations':
    # tests/unit/test_outcome_by_key.py's test_a_a_tests_on_keys_that_differ_decide_falsely_...
    app = _readers_of_keys_that_differ(deployed, {"v1": 1.0, "v2": 1.0}, seed=31)
    try:
        status, found, stderr = _cutover(settings, "--strategy", "ab", "--metric", "converts",
                                         "--min-per-arm", "500", "--max-duration", "15",
                                         "--pre-period", "10", "--alpha", "0.001")
    finally:
        app.stop()
    looks = found["looks"]
    print(f"A/A, keys that differ: {len(looks) - 1} looks, the last {looks[-1]['reason']}; "
          f"{_last(found)}")
    assert all(look["verdict"] in ("started", "continue", "no_data") for look in looks[:-1])
    assert looks[-1]["reason"].startswith("at the deadline"), looks[-1]
    assert (datetime.fromisoformat(looks[-1]["at"])
            - datetime.fromisoformat(looks[0]["at"])).total_seconds() >= 15
    evidence = _last(found)
    assert evidence["unit"] == "key" and evidence["design_effect"] > 1, evidence
    assert evidence["baseline"]["keys"] + evidence["candidate"]["keys"] == len(deployed[3])
    assert evidence["history_slope"] > 0, evidence
    if status == 1:  # not shown non-inferior at the deadline: rolled back, as the policy says
        assert service.serving(JOB).primary == "v1", stderr


def test_keys_that_differ_and_a_worse_candidate_are_rolled_back_by_the_bandit(deployed) -> None:
    settings, service, _, _ = deployed
    # 60 % worse: with 82 keys of Beta(2, 18) rates the test's power is set by the keys, not by
    # the readers. Simulated with this scenario's design (experiment/simulation.py, 1,000
    # seeds), a candidate 40 % worse was rolled back before the deadline in 90 % of runs (CI
    # met one at its 168th look), 60 % worse in 99.8 %, at a median of 6 looks.
    app = _readers_of_keys_that_differ(deployed, {"v1": 1.0, "v2": 0.4}, seed=32)
    try:
        status, found, stderr = _cutover(
            settings, "--strategy", "bandit", "--metric", "converts", "--start-percent", "50",
            "--min-percent", "20", "--max-percent", "50", "--max-step", "25",
            "--max-duration", "120", "--pre-period", "10")
    finally:
        app.stop()
    looks = found["looks"]
    print(f"60 % worse, keys that differ: rolled back at look {len(looks) - 1}: "
          f"{looks[-1]['reason']}; {_last(found)}")
    assert status == 1 and "rolled back" in stderr, stderr
    assert found["verdict"] == "roll_back", found
    _rolled_back_on_its_evidence_before_the_deadline(found)
    assert service.serving(JOB).primary == "v1" and service.serving(JOB).candidate is None


def test_an_outcome_database_whose_clock_is_off_gives_no_data_and_says_so(deployed) -> None:
    """Outcomes' observed_at come from the application's database, the routing's instants from
    the catalog's: with the clocks 5 s apart every look is no_data, with the skew in its
    evidence, until the no-data timeout rolls back."""
    from conftest import with_settings
    from integration.clocks import skewed_postgres

    debian_tool("faketime", "faketime")
    settings, service, _, _ = deployed
    with skewed_postgres(5.0) as uri:
        create_outcomes_table(uri, "app")
        skewed = with_settings(settings, outcomes_pg_dsn=uri)
        defined = kappa_cli(skewed, "metric", "define", JOB, "skewed_converts", "--sql",
                            "SELECT key, converted AS value, observed_at FROM app.outcomes "
                            "WHERE observed_at >= {since}", "--kind", "proportion",
                            "--better", "higher")
        assert defined.returncode == 0, defined.stderr
        status, found, stderr = _cutover(skewed, "--strategy", "ab", "--metric",
                                         "skewed_converts", "--no-data-timeout", "2")
    looks = found["looks"][1:]
    assert status == 1 and "no usable evidence" in stderr, stderr
    assert looks and all("clock is +" in look["reason"] for look in looks[:-1]), looks
    assert all(4 < look["evidence"]["clock_skew_s"] < 6 for look in looks), looks
    assert _last(found, "skewed_converts")["error"].startswith("the outcome database's clock")
    assert service.serving(JOB).primary == "v1" and service.serving(JOB).candidate is None


def test_a_metric_query_past_its_statement_timeout_gives_no_data_then_rolls_back(deployed
                                                                              ) -> None:
    """A metric's query that runs past metric_statement_timeout_ms is cancelled: each look is
    no_data, saying why, never a decision, and the no-data timeout rolls back (#47)."""
    from conftest import with_settings

    settings, service, schema, _ = deployed
    defined = kappa_cli(settings, "metric", "define", JOB, "slow_converts", "--sql",
                        f"SELECT key, converted AS value, observed_at FROM {schema}.outcomes, "
                        "pg_sleep(0.5) WHERE observed_at >= {since}", "--kind", "proportion",
                        "--better", "higher")
    assert defined.returncode == 0, defined.stderr
    slow = with_settings(settings, metric_statement_timeout_ms=100)
    status, found, stderr = _cutover(slow, "--strategy", "ab", "--metric", "slow_converts",
                                     "--no-data-timeout", "2")
    looks = found["looks"][1:]
    assert status == 1 and "no usable evidence" in stderr, stderr
    assert looks and all(look["verdict"] == "no_data" for look in looks[:-1]), looks
    assert "statement timeout" in _last(found, "slow_converts")["error"], _last(
        found, "slow_converts")
    assert service.serving(JOB).primary == "v1" and service.serving(JOB).candidate is None


def test_a_promql_metric_judges_by_the_applications_counters_in_prometheus(
        deployed, scratch: Path) -> None:
    """The application counts its reads and conversions in Prometheus counters labelled by the
    alias's served_by column; a real Prometheus scrapes them, and a PromQL metric decides."""
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    from orchestrator.metrics.promql import PrometheusOutcomes, PromQLError

    from conftest import with_settings
    from integration.observability import free_port, prometheus

    debian_tool("prometheus", "prometheus")
    settings, service, schema, keys = deployed
    registry = CollectorRegistry()
    reads = Counter("widget_reads", "reads", ["served_by"], registry=registry)
    conversions = Counter("widget_conversions", "conversions", ["served_by"], registry=registry)

    def counted(version: str, converted: int) -> None:
        reads.labels(version).inc()
        conversions.labels(version).inc(converted)

    (scratch / "promql").mkdir()
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    count = 'sum(widget_reads_total{served_by="{version}"})'
    total = 'sum(widget_conversions_total{served_by="{version}"})'
    define = ("metric", "define", JOB, "prom_converts", "--kind", "proportion", "--better",
              "higher", "--promql-count", count)
    try:
        with prometheus(scratch / "promql", f"127.0.0.1:{port}") as url:
            prom = with_settings(settings, prometheus_url=url)
            # Refused in one line, storing nothing: no Prometheus named; a query it rejects.
            for where, query, says in ((settings, total, "set KAPPA_PROMETHEUS_URL"),
                                       (prom, total[:-1], "its --promql fails: Prometheus")):
                refused = kappa_cli(where, *define, "--promql", query)
                assert refused.returncode != 0 and says in refused.stderr, refused.stderr
                assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
            assert "prom_converts" not in kappa_cli(settings, "metric", "list", JOB).stdout
            defined = kappa_cli(prom, *define, "--promql", total)
            assert defined.returncode == 0, defined.stderr
            app = Application(settings, schema, keys, {"v1": 0.30, "v2": 0.24},
                              {"v1": 0.05, "v2": 0.05}, seed=19, on_read=counted)
            app.start()
            try:
                done = kappa_cli(prom, "cutover", JOB, "v2", *FAST, "--strategy", "ab",
                                 "--metric", "prom_converts", "--start-percent", "50",
                                 "--max-duration", "60")
            finally:
                app.stop()
            reader = PrometheusOutcomes(url, timeout_s=10)
            wait_until(lambda: (reader.value(count.replace("{version}", "v2"),
                                             datetime.now(UTC)) or 0) >= app.served["v2"],
                       120, "Prometheus to scrape the application's last reads")
            for query, says in (("widget_reads_total", "gives 2 series"),
                                ('widget_reads_total{served_by="v1"}[1m]', "gives a matrix")):
                with pytest.raises(PromQLError, match=says):
                    reader.value(query, datetime.now(UTC))
        found = json.loads(kappa_cli(settings, "experiment", JOB, "--json").stdout)
        away = _prometheus_away_during_a_running_cutover(deployed, counted, scratch,
                                                         f"127.0.0.1:{port}")
    finally:
        server.shutdown()
        server.server_close()
    print(f"Prometheus away: {len(away)} looks, no_data: {away[0]}")
    assert done.returncode == 1 and "rolled back" in done.stderr, done.stderr
    evidence = _last(found, "prom_converts")
    print(f"PromQL look: {evidence}; served {app.served}")
    assert evidence["error"] is None, evidence
    for arm, version in (("baseline", "v1"), ("candidate", "v2")):
        assert 200 <= evidence[arm]["count"] <= app.served[version], (evidence, app.served)
    assert evidence["candidate"]["mean"] < evidence["baseline"]["mean"], evidence
    assert service.serving(JOB).primary == "v1" and service.serving(JOB).candidate is None


def _prometheus_away_during_a_running_cutover(deployed, counted: Any, scratch: Path,
                                              target: str) -> list[Any]:
    """#47: Prometheus goes away while a PromQL cutover runs (an A/A test: it does not decide
    meanwhile). Its looks had evidence; every look after is no_data, saying that Prometheus
    did not answer, and the no-data timeout rolls back. The looks' errors, in order."""
    from conftest import with_settings
    from integration.observability import prometheus

    settings, service, schema, keys = deployed
    (scratch / "away").mkdir()
    app = Application(settings, schema, keys, {"v1": 0.30, "v2": 0.30},
                      {"v1": 0.05, "v2": 0.05}, seed=29, on_read=counted)
    app.start()
    cutover = None
    try:
        with prometheus(scratch / "away", target) as url:
            prom = with_settings(settings, prometheus_url=url)
            cutover = subprocess.Popen(
                [str(Path(sys.executable).with_name("kappa")), "cutover", JOB, "v2", *FAST,
                 "--strategy", "ab", "--metric", "prom_converts", "--start-percent", "50",
                 "--max-duration", "600", "--no-data-timeout", "15", "--alpha", "0.001"],
                env={**os.environ, **prom.driver_environment()}, cwd=ROOT,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

            def looked() -> bool:
                assert cutover is not None and cutover.poll() is None, cutover.communicate()
                found = json.loads(kappa_cli(settings, "experiment", JOB, "--json").stdout)
                return found["version"] == "v2" and found["status"] == "running" and any(
                    _metric(look, "prom_converts")["error"] is None
                    and _metric(look, "prom_converts")["candidate"]["count"] > 0
                    for look in found["looks"][1:])

            wait_until(looked, 120, "a look with Prometheus's evidence", poll_s=0.5)
        stopped_at = datetime.now(UTC)  # Prometheus is gone: the cutover goes on without it
        _, stderr = cutover.communicate(timeout=120)
    finally:
        app.stop()
        if cutover is not None and cutover.returncode is None:
            cutover.kill()
            cutover.communicate()
    assert cutover.returncode == 1 and "no usable evidence" in stderr, stderr
    found = json.loads(kappa_cli(settings, "experiment", JOB, "--json").stdout)
    after = [look for look in found["looks"][1:]
             if datetime.fromisoformat(str(look["at"])) > stopped_at]
    assert after and all(look["verdict"] in ("no_data", "roll_back") for look in after), after
    errors = [_metric(look, "prom_converts")["error"] for look in after]
    assert all(e and "did not answer" in e for e in errors), errors
    assert service.serving(JOB).primary == "v1" and service.serving(JOB).candidate is None
    return errors


def _metric(look: dict[str, Any], metric: str) -> dict[str, Any]:
    (evidence,) = [m for m in look["evidence"]["metrics"] if m["metric"] == metric]
    return evidence


def test_a_running_test_is_on_the_dashboard(deployed, scratch: Path) -> None:
    """While a bandit test runs (an A/A test at alpha 0.001: it will not decide meanwhile), a
    real Prometheus scraping the agent answers every query of the dashboard's cutover row."""
    from orchestrator.metrics.dashboard import panel_queries
    from orchestrator.metrics.dashboard_cutover import TITLES

    from integration.observability import agent, prometheus, query

    debian_tool("prometheus", "prometheus")
    settings, service, schema, keys = deployed
    same = {"v1": 0.3, "v2": 0.3}
    here = scratch / "dashboard"
    here.mkdir()
    env = dict(os.environ, **settings.driver_environment())
    app = Application(settings, schema, keys, same, same, seed=21)
    app.start()
    running = subprocess.Popen(
        [str(Path(sys.executable).with_name("kappa")), "cutover", JOB, "v2", "--strategy",
         "bandit", "--metric", "converts", *FAST, "--min-per-arm", "100", "--alpha", "0.001",
         "--max-duration", "600"], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        with agent(settings, here, "--interval", "1", "--window", "5") as target, \
                prometheus(here, target) as url:
            queries = [(t, q) for t, q in panel_queries(JOB, "v2") if t in TITLES]
            assert {t for t, _ in queries} == set(TITLES)
            for title, expr in queries:
                wait_until(lambda expr=expr: query(url, expr), 90,
                           f"series for panel {title!r}: {expr}")
    finally:
        running.send_signal(signal.SIGKILL)
        _, err = running.communicate()
        app.stop()
    assert service.outcomes.experiment(JOB)["status"] == "running", err
    assert service.abort_cutover(JOB, "v2", reason="the dashboard was checked") is not None
    assert service.serving(JOB).primary == "v1" and service.serving(JOB).candidate is None


def test_a_deferred_test_resumed_late_takes_one_look_then_waits_a_look_again(deployed) -> None:
    """A host that pauses between looks (Airflow defers the task) and is resumed three looks'
    time after the look was due takes that one look and waits a look's time again. The overdue
    looks were taken back to back, on the same observations, the bandit moving its share by
    up to --max-step at each (CI, test_airflow_outcomes: a loaded machine resumed the task
    late, and the DAG's bandit promoted after one deferral)."""
    from orchestrator.experiment.design import ExperimentDesign, Strategy

    service = deployed[1]
    design = ExperimentDesign(Strategy.BANDIT, ("converts",), start_percent=20, min_percent=10,
                              max_percent=60, max_step=20, look_seconds=1.0, min_per_arm=200,
                              pre_period_s=0.0)

    def resume() -> dict[str, Any]:
        return service.cutover(JOB, "v2", ramp=[], soak_seconds=0, experiment=design,
                               pausing=True)

    first = resume()
    assert first["status"] == "waiting", first
    late = datetime.fromisoformat(first["next_look_at"]) + timedelta(seconds=3.0)
    wait_until(lambda: datetime.now(UTC) > late, 30, "three looks' time past the due look")
    try:
        second = resume()
        looks = service.outcomes.experiment(JOB)["looks"]
        assert [look["look"] for look in looks] == [0, 1], [(x["look"], x["at"]) for x in looks]
        assert second["status"] == "waiting", second
        assert datetime.fromisoformat(second["next_look_at"]) >= looks[-1]["at"] + timedelta(
            seconds=design.look_seconds), (second, looks[-1]["at"])
    finally:
        service.abort_cutover(JOB, "v2", reason="the late resume was seen")
    assert service.serving(JOB).primary == "v1" and service.serving(JOB).candidate is None


def test_a_killed_cutover_resumes_with_the_same_statistics_and_promotes_a_better_one(
        deployed) -> None:
    settings, service, schema, keys = deployed
    better = {"v1": 0.30, "v2": 0.36}  # 20 % better, relative
    errors = {"v1": 0.05, "v2": 0.05}
    args = [str(Path(sys.executable).with_name("kappa")), "cutover", JOB, "v2", "--strategy",
            "bandit", "--metric", "converts", "--metric", "errors", "--start-percent", "20",
            "--min-percent", "10", "--max-percent", "60", "--max-step", "20", *FAST]
    env = dict(os.environ, **settings.driver_environment())
    earlier = (service.outcomes.experiment(JOB) or {}).get("plan")  # None: run alone

    def looks_of_a_new_plan() -> int:
        found = service.outcomes.experiment(JOB)  # None until the first plan starts
        return len(found["looks"]) if found is not None and found["plan"] != earlier else 0

    app = Application(settings, schema, keys, better, errors, seed=19)
    app.start()
    first = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        wait_until(lambda: looks_of_a_new_plan() >= 4, 120, "three looks")
        app.stop()  # no reader from here on: every look counts the same observations
        stopped = datetime.now(UTC)
        # A look taken from an instant after the last reader (one that was under way when it
        # stopped counts fewer observations, and would be the killed run's last look).
        wait_until(lambda: service.outcomes.experiment(JOB)["looks"][-1]["at"] > stopped, 120,
                   "a look after the last reader")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
        app.stop()
    before = service.outcomes.experiment(JOB)
    assert before["status"] == "running"
    last = before["looks"][-1]
    # The resumed run's switches ask the broker for the lag (no sample is fresh enough, as
    # when CI's load had aged the agent's last one), and the first ask gets no answer, as a
    # loaded broker's once did in CI at this promote: a plan waits for a lag it can measure
    # rather than roll back a test that has decided.
    resumed = subprocess.Popen([*args, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT, env=dict(
                                   env, KAPPA_LAG_SAMPLE_MAX_AGE_S="0",
                                   KAPPA_FAIL_POINTS="switch.measure_lag=1*unreachable"))
    try:
        wait_until(lambda: len(service.outcomes.experiment(JOB)["looks"]) > len(before["looks"]),
                   120, "a look after the resume")
        again = service.outcomes.experiment(JOB)["looks"][len(before["looks"])]
        for old, new in zip(last["evidence"]["metrics"], again["evidence"]["metrics"],
                            strict=True):
            for key in ("difference", "interval", "statistic", "threshold", "outcome"):
                assert new[key] == old[key], (key, old, new)
            assert new["baseline"] == old["baseline"] and new["candidate"] == old["candidate"]
        app = Application(settings, schema, keys, better, errors, seed=20)
        app.start()
        try:
            out, err = resumed.communicate(timeout=300)
        finally:
            app.stop()
    finally:
        reap(resumed)  # a failed check above left it running, with both pipes open (CI)
    assert resumed.returncode == 0, err
    assert json.loads(out)["status"] == "succeeded"
    assert service.serving(JOB).primary == "v2"
    found = service.outcomes.experiment(JOB)
    assert found["status"] == "succeeded" and found["verdict"] == "promote", found
    assert _last(found)["outcome"] == "better"
    bandit_steps = [h for h in service.history(JOB) if h["reason"] and "P(candidate better)"
                    in h["reason"]]
    assert bandit_steps, service.history(JOB)
    events = [e["kind"] for e in service.events(JOB)]
    assert "experiment_decision" in events and "experiment_started" in events
    table = kappa_cli(settings, "experiment", JOB)
    print(f"kappa experiment {JOB}:\n{table.stdout}")
    assert "statistic / threshold" in table.stdout.lower() and "promote" in table.stdout, \
        table.stdout
    assert "the key is the unit" in table.stdout, table.stdout


def test_a_cutover_killed_after_its_promote_keeps_it_when_run_again(deployed) -> None:
    """The run that promoted dies before its plan ends (fail point cutover.after_decision):
    run again, the plan acts on the stored decision; it neither looks again nor undoes the
    promote (before, its first A/B step refused the promoted version and rolled it back)."""
    settings, service, schema, keys = deployed
    args = ["cutover", JOB, "v2", *FAST, "--strategy", "ab", "--metric", "converts",
            "--start-percent", "50"]
    kappa = str(Path(sys.executable).with_name("kappa"))
    env = dict(os.environ, **settings.driver_environment(),
               KAPPA_FAIL_POINTS="cutover.after_decision=1*exit")
    app = Application(settings, schema, keys, {"v1": 0.30, "v2": 0.45},
                      {"v1": 0.05, "v2": 0.05}, seed=24)
    app.start()
    try:
        crashed = subprocess.run([kappa, *args], env=env, capture_output=True, text=True,
                                 cwd=ROOT, timeout=300, check=False)
    finally:
        app.stop()
    assert crashed.returncode == 86, crashed.stderr
    before = service.outcomes.experiment(JOB)
    assert before["status"] == "running" and before["verdict"] == "promote", before
    assert service.serving(JOB).primary == "v2"
    switches = len(service.history(JOB))
    again = kappa_cli(settings, *args)
    assert again.returncode == 0, again.stderr
    found = service.outcomes.experiment(JOB)
    assert (found["plan"], found["status"]) == (before["plan"], "succeeded"), found
    assert len(found["looks"]) == len(before["looks"])  # no look after the decision
    assert service.serving(JOB).primary == "v2" and len(service.history(JOB)) == switches
