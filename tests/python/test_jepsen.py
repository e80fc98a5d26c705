"""A CI-sized run of the Jepsen-style harness (jepsen.py, root): three combined nodes in network
namespaces, each on a loop-mounted ext4 filesystem of its own, the queue workload (librdkafka
and the Java client in one consumer group) and the list-append workload, under a seeded
schedule of faults that applies every kind at least once (kill -9 of a leader, of the active
controller and of a random node, SIGSTOP, three network partitions, packet loss, a full disk,
a membership change). The checker must find every acknowledged write in the final read, no value
at two offsets, no offset with two values, nothing unsent read, every acknowledged value
received by the consumers, and each reader's view of a key a prefix of its final order. A share
group (two librdkafka share consumers accepting every record) must get every acknowledged
record and none again after its acceptance succeeded.

The checker itself is tested first on small made-up histories, one anomaly each, so a checker
that finds nothing cannot pass for a cluster that loses nothing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import jepsen
from jepsen import APPEND, QUEUE, ConsumerHistory, ProducerHistory, check

# The CI-sized run: every fault twice (two blocks of the schedule), in about a minute and a half;
# no new fault after TIME_LIMIT_S.
CYCLES = 20
SEED = 20_260_515
TIME_LIMIT_S = 150


# ---- the checker, on made-up histories ---------------------------------------------------------


def queue_producer(acks: list[tuple[int, int, int]], attempted_extra=()) -> ProducerHistory:
    """A queue producer's history: (n, partition, offset) acknowledged, value `qp-N`."""
    h = ProducerHistory("p", "queue", QUEUE)
    observed = jepsen.Observed()
    for n, partition, offset in acks:
        h.attempted.add(f"qp-{n}")
        h.ack(0, n, f"qp-{n}", partition, offset, observed)
    h.attempted.update(attempted_extra)
    return h


def queue_consumer(events) -> ConsumerHistory:
    c = ConsumerHistory("c", "queue", QUEUE)
    c.events.extend(events)
    return c


def final_of(records: dict[int, list[str]]) -> dict:
    return {QUEUE: {p: list(enumerate(values)) for p, values in records.items()}}


def test_a_clean_history_is_valid():
    p = queue_producer([(0, 0, 0), (1, 0, 1), (2, 1, 0)])
    c = queue_consumer([("assign", [0, 1]), ("poll", [(0, 0, "qp-0"), (0, 1, "qp-1"), (1, 0, "qp-2")])])
    r = check([p], [c], final_of({0: ["qp-0", "qp-1"], 1: ["qp-2"]}))
    assert r["valid"], r
    assert (r["acknowledged"], r["lost"], r["duplicated"], r["unseen"]) == (3, 0, 0, 0)


def test_an_acknowledged_write_missing_from_the_final_read_is_lost():
    p = queue_producer([(0, 0, 0), (1, 0, 1)])
    c = queue_consumer([("assign", [0]), ("poll", [(0, 0, "qp-0"), (0, 1, "qp-1")])])
    r = check([p], [c], final_of({0: ["qp-0"]}))
    assert r["lost"] == 1 and "lost" in r["anomalies"], r
    assert not r["valid"]


def test_a_value_at_two_offsets_is_duplicated_and_two_values_at_one_offset_are_inconsistent():
    p = queue_producer([(0, 0, 0), (1, 0, 1)])
    c = queue_consumer([("assign", [0]), ("poll", [(0, 0, "qp-0"), (0, 1, "qp-1")])])
    r = check([p], [c], final_of({0: ["qp-0", "qp-1", "qp-0"]}))
    assert r["duplicated"] == 1, r
    # The consumer read qp-1 at offset 1; the final read has qp-0 at offset 1 in this one.
    r = check([p], [c], final_of({0: ["qp-0", "qp-0"]}))
    assert r["inconsistent_offsets"] == 1 and r["lost"] == 1, r


def test_an_unsent_value_is_unexpected_and_an_unread_one_unseen():
    p = queue_producer([(0, 0, 0), (1, 0, 1)])
    c = queue_consumer([("assign", [0]), ("poll", [(0, 0, "qp-0")])])
    r = check([p], [c], final_of({0: ["qp-0", "qp-1", "made-up"]}))
    assert (r["unexpected"], r["unseen"]) == (1, 1), r
    assert set(r["anomalies"]) == {"unexpected", "unseen"}


def test_polls_skipping_or_going_back_within_an_assignment_fail_and_across_a_rebalance_do_not():
    p = queue_producer([(n, 0, n) for n in range(4)])
    final = final_of({0: [f"qp-{n}" for n in range(4)]})
    skip = queue_consumer([("assign", [0]), ("poll", [(0, 0, "qp-0"), (0, 2, "qp-2")]),
                           ("poll", [(0, 1, "qp-1"), (0, 3, "qp-3")])])
    r = check([p], [skip], final)
    assert r["poll_skips"] == 2 and r["nonmonotonic_polls"] == 1, r
    assert not r["valid"]
    # Back to the last commit, then past what this member read (another read it meanwhile).
    rebalanced = queue_consumer([("assign", [0]), ("poll", [(0, 0, "qp-0"), (0, 1, "qp-1")]),
                                 ("revoke", [0]), ("assign", [0]), ("poll", [(0, 0, "qp-0")]),
                                 ("revoke", [0]), ("assign", [0]), ("poll", [(0, 2, "qp-2"), (0, 3, "qp-3")])])
    r = check([p], [rebalanced], final)
    assert r["valid"], r
    assert r["nonmonotonic_polls_after_rebalance"] == 1 and r["poll_skips_after_rebalance"] == 1, r


def test_acknowledged_offsets_going_back_in_send_order_are_nonmonotonic_sends():
    p = queue_producer([(0, 0, 1), (1, 0, 0)])
    c = queue_consumer([("assign", [0]), ("poll", [(0, 0, "qp-1"), (0, 1, "qp-0")])])
    r = check([p], [c], final_of({0: ["qp-1", "qp-0"]}))
    assert r["nonmonotonic_sends"] == 1 and r["anomalies"] == ["nonmonotonic_sends"], r


def test_a_reader_whose_view_of_a_key_is_not_a_prefix_of_its_order_is_incompatible():
    h = ProducerHistory("ap", "append", APPEND)
    observed = jepsen.Observed()
    values = ["aap-k1-0", "aap-k1-1", "aap-k1-2"]
    for n, v in enumerate(values):
        h.attempted.add(v)
        h.ack(0, n, v, 0, n, observed)
    reader = ConsumerHistory("ar", "append", APPEND)
    # It read offsets 0 and 2 of the key's partition as the values of offsets 0 and 1.
    reader.events.extend([("assign", [0]), ("poll", [(0, 0, "aap-k1-0"), (0, 1, "aap-k1-2")])])
    r = check([h], [reader], {APPEND: {0: list(enumerate(values))}})
    assert r["incompatible_orders"] == 1 and r["inconsistent_offsets"] == 1, r


def test_a_payload_whose_bytes_differ_from_what_was_sent_reads_as_an_unsent_value():
    sent = jepsen.payload("qp-0")
    assert jepsen.value_of(sent) == "qp-0"
    flipped = sent[:-1] + (b"0" if sent[-1:] != b"0" else b"1")
    assert jepsen.value_of(flipped) == "qp-0#corrupt"
    assert jepsen.value_of(jepsen.payload("qp-1").replace(b"qp-1", b"qp-0")) == "qp-0#corrupt"
    p = queue_producer([(0, 0, 0)])
    c = queue_consumer([("assign", [0]), ("poll", [(0, 0, jepsen.value_of(flipped))])])
    r = check([p], [c], final_of({0: ["qp-0"]}))
    assert r["unexpected"] == 1 and r["inconsistent_offsets"] == 1 and r["unseen"] == 1, r


def test_a_history_with_nothing_acknowledged_is_invalid():
    r = check([queue_producer([])], [queue_consumer([])], final_of({0: []}))
    assert r["anomalies"] == ["nothing acknowledged"], r


def share_history(acks: dict[str, tuple[int, int]], deliveries: list[tuple], accepted: dict[str, float],
                  extra_attempted=()):
    """The share workload's producer (values acknowledged at (partition, offset)) and one member
    (deliveries (value, partition, offset, delivery count, when); accepted value -> when)."""
    h = ProducerHistory("sp", "share", jepsen.SHARE)
    observed = jepsen.Observed()
    for n, (value, (partition, offset)) in enumerate(acks.items()):
        h.attempted.add(value)
        h.ack(0, n, value, partition, offset, observed)
    h.attempted.update(extra_attempted)
    m = jepsen.ShareMember("sm", observed, "unused:9092")
    m.deliveries.extend(deliveries)
    m.accepted.update(accepted)
    return [h], [m]


def test_the_share_checker_finds_each_anomaly():
    acks = {"s-0": (0, 0), "s-1": (0, 1), "s-2": (1, 0)}
    final = {0: [(0, "s-0"), (1, "s-1")], 1: [(0, "s-2")]}
    clean = [("s-0", 0, 0, 1, 1.0), ("s-1", 0, 1, 1, 1.0), ("s-2", 1, 0, 1, 1.0), ("s-2", 1, 0, 2, 5.0)]
    r = jepsen.check_share(*share_history(acks, clean, {"s-0": 2.0, "s-1": 2.0, "s-2": 6.0}), final)
    # s-2 came twice (its first acceptance did not succeed): reported, not an anomaly.
    assert r["share_anomalies"] == [] and r["share_redelivered"] == 1 and r["share_never_accepted"] == 0, r
    # Delivered again after its acceptance succeeded.
    r = jepsen.check_share(*share_history(acks, clean, {"s-0": 2.0, "s-1": 2.0, "s-2": 2.0}), final)
    assert r["share_anomalies"] == ["share_redelivered_after_acceptance"], r
    # Acknowledged, never delivered; and acknowledged, not in the final read.
    r = jepsen.check_share(*share_history(acks, clean[:2], {"s-0": 2.0, "s-1": 2.0}), final)
    assert r["share_anomalies"] == ["share_undelivered"], r
    r = jepsen.check_share(*share_history(acks, clean, {"s-0": 2.0}), {0: [(0, "s-0"), (1, "s-1")], 1: []})
    assert r["share_anomalies"] == ["share_lost"] and r["share_never_accepted"] == 2, r
    # Delivered, never sent; one value at two offsets; a delivery count that repeats.
    r = jepsen.check_share(*share_history(acks, clean + [("x-9", 0, 2, 1, 1.0)], {}), final)
    assert r["share_anomalies"] == ["share_unexpected"], r
    r = jepsen.check_share(*share_history(acks, clean, {}), {0: [(0, "s-0"), (1, "s-1"), (2, "s-1")], 1: [(0, "s-2")]})
    assert r["share_anomalies"] == ["share_duplicated"], r
    r = jepsen.check_share(*share_history(acks, clean + [("s-0", 0, 0, 1, 1.5)], {}), final)
    assert r["share_anomalies"] == [] and r["share_delivery_counts_repeated"] == 1, r
    r = jepsen.check_share(*share_history({}, [], {}), {})
    assert r["share_anomalies"] == ["share: nothing acknowledged"], r


def test_the_schedule_is_the_seeds_and_each_block_holds_every_fault():
    a = jepsen.schedule(7, 25)
    assert a == jepsen.schedule(7, 25) and a != jepsen.schedule(8, 25)
    n = len(jepsen.FAULTS)
    assert sorted(kind for kind, _, _ in a[:n]) == sorted(jepsen.FAULTS)
    assert all(jepsen.HOLD_S[0] <= hold <= jepsen.HOLD_S[1] for _, hold, _ in a)


# ---- the CI-sized run against real processes ---------------------------------------------------


def test_a_short_run_under_every_fault_loses_nothing_and_reads_consistently(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces and loop devices")
    missing = [t for t in ("ip", "nft", "mkfs.ext4", "losetup", "java") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")
    from reference import ensure_jars

    ensure_jars()
    out = Path(tmp_path) / "jepsen"
    r = jepsen.run(CYCLES, SEED, nodes=3, out=out, java=True, time_limit_s=TIME_LIMIT_S)
    print(jepsen.summary(r))
    assert r["valid"], (r["anomalies"], r["examples"])
    # Every kind applied, and enough written under them to mean something.
    # The first block of the schedule holds every fault: a slow machine may stop after it.
    assert r["cycles"] >= len(jepsen.FAULTS), f"{r['cycles']} of {CYCLES} cycles within {TIME_LIMIT_S} s"
    assert set(r["fault_mix"]) == set(jepsen.FAULTS), r["fault_mix"]
    assert r["acknowledged_by_workload"]["queue"] > 1_000 and r["acknowledged_by_workload"]["append"] > 1_000, r
    # The share group got every acknowledged record, none again after its acceptance succeeded.
    assert r["share_acknowledged"] > 500 and r["share_delivered"] >= r["share_acknowledged"], r
    assert r["share_lost"] == 0 and r["share_undelivered"] == 0 and r["share_redelivered_after_acceptance"] == 0, r
    assert r["lost"] == 0 and r["duplicated"] == 0 and r["inconsistent_offsets"] == 0
    assert r["final_read_records"] >= r["acknowledged"]
    assert r["java_finished"], "the Java client did not stop cleanly"
    assert not r["panics"], r["panics"]
    assert not r["nemesis_errors"], r["nemesis_errors"]
