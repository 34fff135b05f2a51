"""The raw read rate of a topic: what a replay of it could reach (no decoding, no writing).

One process reading every partition from offset 0, and one process per usable core over
disjoint partitions (spawned, timed from a common start barrier to the last to finish).
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition


def reader(bootstrap: str, topic: str) -> Consumer:
    """A consumer connected to the topic's broker, tuned as one big reader."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        # The single-big-reader tuning measured on Tansu (shared/ENVIRONMENT.md).
        "fetch.max.bytes": 50 * 1024 * 1024, "max.partition.fetch.bytes": 8 * 1024 * 1024,
        "queued.max.messages.kbytes": 262144, "queued.min.messages": 1000000,
        "fetch.wait.max.ms": 100,
    })
    consumer.list_topics(topic, timeout=10)  # connects: not part of the timed read
    return consumer


def read_all(consumer: Consumer, topic: str, partitions: list[int]) -> int:
    """Records from offset 0 to the end of each partition (no decoding)."""
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    pending, seen = set(partitions), 0
    while pending:
        # consume() waits out its whole timeout unless the batch fills: a long one would add
        # that wait to the tail of every read (a second on 20,000 records).
        for msg in consumer.consume(10000, 0.05):
            err = msg.error()
            if err is None:
                seen += 1
            elif err.code() == KafkaError._PARTITION_EOF:
                pending.discard(msg.partition())
            else:
                raise RuntimeError(err)
    return seen


def topic_partitions(bootstrap: str, topic: str) -> list[int]:
    consumer = reader(bootstrap, topic)
    partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.close()
    return partitions


def raw_read_rate(bootstrap: str, topic: str, expected: int) -> float:
    """Records/s of one process reading the whole topic."""
    partitions = topic_partitions(bootstrap, topic)
    consumer = reader(bootstrap, topic)
    began = time.perf_counter()
    seen = read_all(consumer, topic, partitions)
    elapsed = time.perf_counter() - began
    consumer.close()
    if seen != expected:
        raise RuntimeError(f"raw reader saw {seen} records, expected {expected}")
    return seen / elapsed


def _read_share(bootstrap: str, topic: str, partitions: list[int], barrier: Any,
                results: Any) -> None:
    """One reader process: connect, wait for the others, read its partitions; report
    (records, began, ended) on the monotonic clock, which all processes share on Linux."""
    consumer = reader(bootstrap, topic)
    barrier.wait()
    began = time.monotonic()
    seen = read_all(consumer, topic, partitions)
    results.put((seen, began, time.monotonic()))
    consumer.close()


def raw_read_rate_all_cores(bootstrap: str, topic: str, expected: int) -> tuple[float, int]:
    """(records/s, processes): one reader process per usable core over disjoint partitions."""
    partitions = topic_partitions(bootstrap, topic)
    n = min(len(os.sched_getaffinity(0)), len(partitions))
    ctx = multiprocessing.get_context("spawn")  # no forked librdkafka threads or sockets
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_read_share, args=(bootstrap, topic, partitions[i::n], barrier,
                                                   results)) for i in range(n)]
    for p in procs:
        p.start()
    reports = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a reader process exited with {p.exitcode}")
    seen = sum(r[0] for r in reports)
    if seen != expected:
        raise RuntimeError(f"{n} raw readers saw {seen} records, expected {expected}")
    return seen / (max(r[2] for r in reports) - min(r[1] for r in reports)), n
