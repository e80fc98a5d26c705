"""Rebalance after a member's death: how long a consumer group takes to hand a killed member's
partitions to the survivors, and what the survivors notice meanwhile, for three protocols:

- eager:       classic protocol, `partition.assignment.strategy=range`
- cooperative: classic protocol, `partition.assignment.strategy=cooperative-sticky`
- consumer:    KIP-848, `group.protocol=consumer` (the broker's assignor, session timeout and
               heartbeat interval)

Each run starts a fresh `target/debug/sluice --cores 2 --group-initial-rebalance-delay-ms 300`
(and, for KIP-848, a 45 s session with a 2 s heartbeat interval)
(tests/python/harness.py's Broker), creates a 6-partition topic, starts a producer process
(keyed messages at a steady rate, each value carrying its produce time) and three group members
(processes, this file with `--member`), waits for a stable assignment plus a few seconds, then
sends SIGKILL to one member by its PID and measures, from the members' JSON-line logs (every
timestamp is `time.time()`, comparable across processes on one machine):

1. reassignment: from the kill to the survivors' assign callbacks covering every partition the
   dead member owned;
2. pause: per survivor, the longest gap between consumed messages on the partitions it owned
   before the kill and still owns after, in the window [kill, reassignment + 5 s];
3. redelivered: messages (partition, offset) consumed more than once.

Members commit synchronously after every batch and, in their revoke callback, what they
processed of the revoked partitions. A measurement, not a test: nothing fails on a figure.

    perf/rebalance                      # both repetitions of the three protocols, about 3.5 minutes
    perf/rebalance --reps 1 --protocols eager,cooperative
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PARTITIONS = 6
MEMBERS = 3
RATE = 2_000  # messages per second
KEYS = 997
INITIAL_REBALANCE_DELAY_MS = 300
CLASSIC_SESSION_TIMEOUT_MS = 6_000
CLASSIC_HEARTBEAT_MS = 1_000
# KIP-848: the broker owns these (group.consumer.session.timeout.ms, Kafka's default, and
# group.consumer.heartbeat.interval.ms, 2 s where Kafka's default is 5 s: constants in
# broker/src/group/consumer.rs); the client sets neither.
CONSUMER_SESSION_TIMEOUT_MS = 45_000
CONSUMER_HEARTBEAT_MS = 2_000

CLASSIC = {"session.timeout.ms": CLASSIC_SESSION_TIMEOUT_MS, "heartbeat.interval.ms": CLASSIC_HEARTBEAT_MS}
PROTOCOLS = {
    "eager": {
        "config": {**CLASSIC, "partition.assignment.strategy": "range"},
        "session_timeout_ms": CLASSIC_SESSION_TIMEOUT_MS,
        "heartbeat_ms": CLASSIC_HEARTBEAT_MS,
        "what": "classic, partition.assignment.strategy=range (eager)",
    },
    "cooperative": {
        "config": {**CLASSIC, "partition.assignment.strategy": "cooperative-sticky"},
        "session_timeout_ms": CLASSIC_SESSION_TIMEOUT_MS,
        "heartbeat_ms": CLASSIC_HEARTBEAT_MS,
        "what": "classic, partition.assignment.strategy=cooperative-sticky",
    },
    "consumer": {
        "config": {"group.protocol": "consumer"},
        "session_timeout_ms": CONSUMER_SESSION_TIMEOUT_MS,
        "heartbeat_ms": CONSUMER_HEARTBEAT_MS,
        "what": "KIP-848, group.protocol=consumer (broker-side session timeout and heartbeat)",
    },
}

SETTLE_S = 3.0  # after the assignment is stable, before the kill
QUIET_S = 2.0  # no assign/revoke/lost for this long counts as stable
AFTER_S = 5.0  # the pause window runs to reassignment + this
STABLE_TIMEOUT_S = 60.0
REASSIGN_MARGIN_S = 60.0  # beyond the session timeout, before giving up on the reassignment
STOP_TIMEOUT_S = 20.0
# Rough duration of one run beyond the session timeout: broker start, members joining, settling,
# the pause window and stopping everything. Refined from the runs already done.
OVERHEAD_ESTIMATE_S = 30.0


def now() -> float:
    return time.time()


# ---- the producer process ----------------------------------------------------------------------


def producer_main(spec: dict) -> int:
    """Produces keyed messages at spec["rate"] per second until spec["stop"] exists; the value is
    `<seq>|<time.time() when produced>`. Logs progress and a summary as JSON lines."""
    from confluent_kafka import Producer

    log = open(spec["log"], "a", buffering=1)

    def emit(ev: str, **fields) -> None:
        log.write(json.dumps({"t": now(), "ev": ev, **fields}) + "\n")

    acked = failed = 0
    errors: Counter = Counter()

    def on_delivery(err, msg):
        nonlocal acked, failed
        if err is None:
            acked += 1
        else:
            failed += 1
            errors[str(err)] += 1

    p = Producer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "client.id": "rebalance-producer",
            "acks": "all",
            "linger.ms": 5,
            "enable.idempotence": False,
            "message.timeout.ms": 30_000,
            "log.connection.close": False,
        }
    )
    stop = Path(spec["stop"])
    rate = spec["rate"]
    emit("started", pid=os.getpid())
    started = time.monotonic()
    next_report = started + 1.0
    seq = 0
    while not stop.exists():
        # Paced in steps of 20 messages (10 ms at 2,000/s).
        ahead = started + seq / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        for _ in range(20):
            value = b"%d|%.6f" % (seq, now())
            while True:
                try:
                    p.produce(spec["topic"], key=b"k%03d" % ((seq * 7919) % KEYS), value=value, on_delivery=on_delivery)
                    break
                except BufferError:
                    p.poll(0.01)
            seq += 1
        p.poll(0)
        if time.monotonic() >= next_report:
            next_report += 1.0
            emit("progress", sent=seq, acked=acked, failed=failed)
    left = p.flush(30)
    emit("done", sent=seq, acked=acked, failed=failed, unflushed=left, errors=dict(errors))
    log.close()
    return 0


# ---- the member process --------------------------------------------------------------------------


def member_main(spec: dict) -> int:
    """One group member: subscribes, consumes, commits synchronously after every batch (and in
    its revoke callback what it processed of the revoked partitions), logs one JSON line per
    event until spec["stop"] exists, then closes."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    log = open(spec["log"], "a", buffering=1)  # line-buffered: each event reaches the OS at once
    topic = spec["topic"]

    def emit(ev: str, **fields) -> None:
        log.write(json.dumps({"t": now(), "ev": ev, **fields}) + "\n")

    processed: dict[int, int] = {}  # partition -> next offset after the last processed message
    committed: dict[int, int] = {}
    commits_ok = 0

    def commit(offsets: dict[int, int], where: str) -> None:
        nonlocal commits_ok
        t0 = now()
        try:
            result = c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
        except KafkaException as e:
            emit("commit_failed", where=where, offsets=offsets, error=str(e), took=now() - t0)
            return
        failed = {tp.partition: str(tp.error) for tp in result if tp.error is not None}
        for tp in result:
            if tp.error is None:
                committed[tp.partition] = max(committed.get(tp.partition, -1), tp.offset)
        if failed:
            emit("commit_failed", where=where, offsets=offsets, errors=failed, took=now() - t0)
        else:
            commits_ok += 1
            if where != "batch":
                emit("committed", where=where, offsets=offsets, took=now() - t0)

    def on_assign(consumer, parts):
        emit("assign", parts=sorted(tp.partition for tp in parts))

    def on_revoke(consumer, parts):
        t0 = now()
        ps = sorted(tp.partition for tp in parts)
        pending = {p: processed[p] for p in ps if processed.get(p, -1) > committed.get(p, -1)}
        if pending:
            commit(pending, "revoke")
        for p in ps:
            processed.pop(p, None)
            committed.pop(p, None)
        emit("revoke", parts=ps, began=t0)

    def on_lost(consumer, parts):
        ps = sorted(tp.partition for tp in parts)
        for p in ps:
            processed.pop(p, None)
            committed.pop(p, None)
        emit("lost", parts=ps)

    c = Consumer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "group.id": spec["group"],
            "client.id": spec["name"],
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
            "log.connection.close": False,
            **spec["config"],
        }
    )
    c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    emit("started", pid=os.getpid())
    stop = Path(spec["stop"])
    while not stop.exists():
        msgs = c.consume(num_messages=500, timeout=0.2)
        if not msgs:
            continue
        t = now()
        records = []
        batch: dict[int, int] = {}
        for m in msgs:
            err = m.error()
            if err is not None:
                emit("error", code=err.code(), error=str(err))
                continue
            try:
                produced = float(m.value().split(b"|", 1)[1])
            except (IndexError, ValueError):
                emit("damaged", partition=m.partition(), offset=m.offset(), value=repr(m.value()[:40]))
                continue
            records.append([m.partition(), m.offset(), round(produced, 6)])
            batch[m.partition()] = m.offset() + 1
        if not records:
            continue
        log.write(json.dumps({"t": t, "ev": "consumed", "records": records}) + "\n")
        processed.update(batch)
        commit(batch, "batch")
    emit("stopping", assignment=sorted(tp.partition for tp in c.assignment()), commits_ok=commits_ok)
    c.close()
    emit("closed")
    log.close()
    return 0


# ---- child processes, as seen by the orchestrator -------------------------------------------------


class Child:
    """A process this script started (a member or the producer) and its JSON-line log."""

    def __init__(self, workdir: Path, name: str, mode: str, spec: dict):
        self.name = name
        self.log_path = workdir / f"{name}.jsonl"
        self.stop_path = workdir / f"{name}.stop"
        self.stderr_path = workdir / f"{name}.stderr"
        spec = {**spec, "name": name, "log": str(self.log_path), "stop": str(self.stop_path)}
        self.killed_at: float | None = None
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, mode, json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
            )
        self._events: list[dict] = []
        self._pos = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def events(self) -> list[dict]:
        """Every complete line logged so far (read incrementally)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return self._events
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            e = json.loads(line)
            e["member"] = self.name
            self._events.append(e)
        self._pos += end
        return self._events

    def sigkill(self) -> float:
        """SIGKILL to this child's PID; returns the moment it was sent."""
        self.killed_at = now()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        return self.killed_at

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> str:
        """Asks the child to finish (its stop file) and waits; SIGKILL by PID if it does not."""
        if self.proc.poll() is not None:
            return f"exited {self.proc.returncode}"
        self.stop_path.touch()
        try:
            code = self.proc.wait(timeout=timeout)
            return "closed" if code == 0 else f"exited {code}"
        except subprocess.TimeoutExpired:
            self.ensure_dead()
            return f"did not close within {timeout} s; killed"

    def ensure_dead(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stderr_tail(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            return ""

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None and self.killed_at is None:
            raise RuntimeError(f"{self.name} (pid {self.pid}) exited with {code}\n{self.stderr_tail()}")


def ownership(m: Child, until: float = float("inf")) -> set[int]:
    """What member m owns after replaying its assign/revoke/lost events up to `until`."""
    owned: set[int] = set()
    for e in m.events():
        if e["t"] > until:
            break
        if e["ev"] == "assign":
            owned |= set(e["parts"])
        elif e["ev"] in ("revoke", "lost"):
            owned -= set(e["parts"])
    return owned


def balanced(ms: list[Child]) -> dict[str, list[int]] | None:
    owned = {m.name: ownership(m) for m in ms}
    every = sorted(p for s in owned.values() for p in s)
    if every != list(range(PARTITIONS)) or max(map(len, owned.values())) - min(map(len, owned.values())) > 1:
        return None
    return {name: sorted(s) for name, s in owned.items()}


def last_change(ms: list[Child]) -> float:
    return max((e["t"] for m in ms for e in m.events() if e["ev"] in ("assign", "revoke", "lost")), default=0.0)


# ---- one run -------------------------------------------------------------------------------------


class Run:
    def __init__(self, protocol: str, rep: int, workroot: Path, t0: float, keep: bool):
        self.protocol, self.rep, self.t0, self.keep = protocol, rep, t0, keep
        self.p = PROTOCOLS[protocol]
        self.workdir = workroot / f"{protocol}-{rep}"
        self.workdir.mkdir(parents=True)
        self.broker = None
        self.children: list[Child] = []

    def say(self, what: str) -> None:
        print(f"[{now() - self.t0:6.1f} s] {self.protocol} #{self.rep}: {what}", flush=True)

    def wait_for(self, what: str, predicate, timeout: float, ms: list[Child], poll: float = 0.1):
        deadline = now() + timeout
        while True:
            for c in self.children:
                c.check_alive()
            if self.broker is not None and not self.broker.running():
                raise RuntimeError(f"the broker exited while waiting for {what}\n{self.broker.log_tail(30)}")
            result = predicate()
            if result:
                return result
            if now() > deadline:
                owned = {m.name: sorted(ownership(m)) for m in ms}
                raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}; members own {owned}")
            time.sleep(poll)

    def execute(self) -> dict:
        sys.path.insert(0, str(REPO / "tests" / "python"))
        from harness import Broker, create_topic

        started = now()
        self.broker = Broker(
            cores=2,
            name=f"rebalance-{self.protocol}",
            # KIP-848: the session and heartbeat the recorded figures were measured with
            # (Kafka's default session; a heartbeat shorter than Kafka's 5 s default).
            extra_args=[
                "--group-initial-rebalance-delay-ms", str(INITIAL_REBALANCE_DELAY_MS),
                "--group-consumer-session-timeout-ms", "45000",
                "--group-consumer-heartbeat-interval-ms", "2000",
            ],
        )
        self.broker.start()
        self.say(f"broker pid {self.broker.pid} on {self.broker.bootstrap}")
        topic, group = "rebalance", f"rebalance-{self.protocol}"
        create_topic(self.broker.bootstrap, topic, PARTITIONS)

        common = {"bootstrap": self.broker.bootstrap, "topic": topic}
        producer = Child(self.workdir, "producer", "--producer", {**common, "rate": RATE})
        self.children.append(producer)
        self.wait_for("the producer's first acknowledgements", lambda: any(e.get("acked") for e in producer.events()), 30, [])
        self.say(f"producer pid {producer.pid} at {RATE} msg/s; starting {MEMBERS} members")

        members = []
        for i in range(MEMBERS):
            m = Child(self.workdir, f"m{i}", "--member", {**common, "group": group, "config": self.p["config"]})
            members.append(m)
            self.children.append(m)

        def stable():
            a = balanced(members)
            if a is None or now() - last_change(members) < QUIET_S:
                return None
            consuming = {e["member"] for m in members for e in m.events() if e["ev"] == "consumed"}
            return a if consuming == {m.name for m in members} else None

        assignment = self.wait_for("a stable assignment", stable, STABLE_TIMEOUT_S, members)
        t_stable = now()
        self.say(f"stable: {assignment}; settling {SETTLE_S:.0f} s")
        time.sleep(SETTLE_S)
        before = balanced(members)
        if before != assignment:
            raise RuntimeError(f"the assignment moved while settling: {assignment} -> {before}")
        # Range hands out contiguous ranges in member order: killing the member in the middle
        # lets both survivors keep theirs, so every survivor has partitions to measure the pause
        # on. The same rule for every protocol: the member whose lowest partition is the median.
        by_low = sorted(members, key=lambda m: min(before[m.name]))
        victim = by_low[len(by_low) // 2]
        survivors = [m for m in members if m is not victim]
        victim_parts = set(before[victim.name])
        t_kill = victim.sigkill()
        self.say(f"SIGKILL to {victim.name} (pid {victim.pid}), which owned {sorted(victim_parts)}")

        def reassigned():
            got = {}
            for m in survivors:
                for e in m.events():
                    if e["ev"] == "assign" and e["t"] > t_kill:
                        for p in set(e["parts"]) & victim_parts:
                            got.setdefault(p, e["t"])
            if set(got) != victim_parts:
                return None
            # Still owned by a survivor now (not handed out and taken back).
            live = set().union(*(ownership(m) for m in survivors))
            return max(got.values()) if victim_parts <= live else None

        t_reassigned = self.wait_for(
            "the survivors to own the dead member's partitions",
            reassigned,
            self.p["session_timeout_ms"] / 1000 + REASSIGN_MARGIN_S,
            survivors,
            poll=0.2,
        )
        self.say(f"reassigned {t_reassigned - t_kill:.2f} s after the kill; watching {AFTER_S:.0f} s more")
        # The window ends AFTER_S after the reassignment; wait a little past it for the logs.
        time.sleep(max(0.0, t_reassigned + AFTER_S + 1.0 - now()))
        after = {m.name: sorted(ownership(m)) for m in survivors}

        outcomes = {m.name: m.stop() for m in survivors}
        outcomes["producer"] = producer.stop(timeout=45)
        self.say(f"members and producer stopped: {outcomes}")
        self.stop_broker()
        expired = self.session_expired_after(group, t_kill)
        result = analyse(
            self.protocol, members, survivors, victim, producer, before, after, victim_parts,
            t_stable, t_kill, t_reassigned, expired,
        )
        result.update(
            rep=self.rep,
            stop_outcomes=outcomes,
            broker=self.broker_log_summary(),
            run_seconds=round(now() - started, 1),
        )
        return result

    def stop_broker(self) -> None:
        if self.broker is None or not self.broker.running():
            return
        code = self.broker.stop()  # SIGTERM by PID, SIGKILL after 10 s (and an error)
        self.say(f"broker stopped, exit {code}")

    def session_expired_after(self, group: str, t_kill: float) -> float | None:
        """When the broker logged the dead member's session as expired, from the kill (its log
        lines carry UTC wall-clock timestamps, comparable with time.time())."""
        for line in self.broker.log_text().splitlines():
            if "session expired" in line and f"group={group} " in line + " ":
                try:
                    t = datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
                except ValueError:
                    continue
                if t > t_kill:
                    return r3(t - t_kill)
        return None

    def broker_log_summary(self) -> dict:
        text = self.broker.log_text() if self.broker is not None else ""
        lines = text.splitlines()
        odd = [l for l in lines if " WARN " in l or " ERROR " in l or "panicked" in l]
        return {
            "log_lines": len(lines),
            "warn_or_error_lines": len(odd),
            "warn_or_error_sample": [l[-300:] for l in odd[:15]],
            "panicked": any("panicked" in l for l in lines),
        }

    def cleanup(self, failed: bool) -> None:
        """Every process this run started ends here, by PID, also on failure."""
        for c in self.children:
            try:
                c.ensure_dead()
            except Exception as e:
                print(f"could not end {c.name} (pid {c.pid}): {e}", file=sys.stderr)
        if self.broker is not None and self.broker.proc is not None and self.broker.running():
            try:
                self.broker.stop()
            except Exception as e:
                print(f"broker pid {self.broker.pid}: {e}", file=sys.stderr)
            if self.broker.running():  # still there after SIGKILL: should not happen
                print(f"broker pid {self.broker.pid} is still running", file=sys.stderr)
        if self.broker is not None:
            if failed or self.keep:
                self.say(f"broker files kept in {self.broker.root}, member logs in {self.workdir}")
            else:
                self.broker.remove()


# ---- analysis ----------------------------------------------------------------------------------


def max_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest interval in [start, end] without a consumption at `times`, counting both
    window edges; returns (length, where it began)."""
    points = [start] + sorted(t for t in times if start < t < end) + [end]
    best = max(((b - a, a) for a, b in zip(points, points[1:])), default=(end - start, start))
    return best


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def r3(x):
    return None if x is None else round(x, 3)


def analyse(protocol, members, survivors, victim, producer, before, after, victim_parts, t_stable, t_kill, t_reassigned, expired):
    window_end = t_reassigned + AFTER_S
    # The rebalance itself: from 1 s before the broker expired the session (or before the
    # reassignment, if the broker's log did not say) to the end of the window. KIP-848's window
    # from the kill is four times as long as the classic one, and catches more unrelated hiccups.
    near_start = t_kill + expired - 1.0 if expired is not None else t_reassigned - 1.0
    baseline_start = t_kill - SETTLE_S
    consumed = [(m.name, e["t"], p, o, ts) for m in members for e in m.events() if e["ev"] == "consumed" for p, o, ts in e["records"]]

    per_survivor = {}
    for m in survivors:
        kept = set(before[m.name]) & set(after[m.name])
        moved_away = sorted(set(before[m.name]) - set(after[m.name]))
        mine = [(t, ts) for name, t, p, o, ts in consumed if name == m.name and p in kept]
        times = sorted({t for t, _ in mine})
        pause, pause_from = max_gap(times, t_kill, window_end) if kept else (None, None)
        base, _ = max_gap(times, baseline_start, t_kill) if kept else (None, None)
        near, _ = max_gap(times, near_start, window_end) if kept else (None, None)
        lat_window = [t - ts for t, ts in mine if t_kill <= t <= window_end]
        lat_base = [t - ts for t, ts in mine if baseline_start <= t < t_kill]
        # How long the kept partitions went without this owner: revoke or lost to the next
        # assign that gave them back (eager revokes everything for the rebalance).
        unowned = 0.0
        for p in kept:
            since = None
            for e in m.events():
                if not (t_kill < e["t"] <= window_end) or p not in e.get("parts", ()):
                    continue
                if e["ev"] in ("revoke", "lost") and since is None:
                    since = e.get("began", e["t"])
                elif e["ev"] == "assign" and since is not None:
                    unowned = max(unowned, e["t"] - since)
                    since = None
            if since is not None:
                unowned = max(unowned, window_end - since)
        own_revoked = [
            {"at": r3(e["t"] - t_kill), "parts": e["parts"], "ev": e["ev"]}
            for e in m.events()
            if e["ev"] in ("revoke", "lost") and t_kill < e["t"] <= window_end and set(e["parts"]) & set(before[m.name])
        ]
        per_survivor[m.name] = {
            "owned_before": before[m.name],
            "owned_after": after[m.name],
            "kept": sorted(kept),
            "moved_to_other_survivor": moved_away,
            "pause_s": r3(pause),
            "pause_began_s_after_kill": r3(pause_from - t_kill) if pause_from is not None else None,
            "pause_near_rebalance_s": r3(near),
            "baseline_max_gap_s": r3(base),
            "kept_partitions_unowned_s": r3(unowned) if kept else None,
            "latency_s": {
                "baseline_p50": r3(percentile(lat_base, 0.5)),
                "window_p50": r3(percentile(lat_window, 0.5)),
                "window_max": r3(max(lat_window, default=None)),
            },
            "own_partitions_revoked_or_lost": own_revoked,
        }

    # The rebalance as the survivors' callbacks saw it, times relative to the kill.
    timeline = [
        {"at": r3(e["t"] - t_kill), "member": e["member"], "ev": e["ev"], "parts": e["parts"]}
        for m in survivors
        for e in m.events()
        if e["ev"] in ("assign", "revoke", "lost") and t_kill < e["t"] <= window_end
    ]
    timeline.sort(key=lambda x: x["at"])
    first_callback = timeline[0]["at"] if timeline else None

    counts = Counter((p, o) for _, _, p, o, _ in consumed)
    again = {k: n for k, n in counts.items() if n > 1}
    redelivered = {
        "messages": sum(n - 1 for n in again.values()),
        "on_dead_members_partitions": sum(n - 1 for (p, _), n in again.items() if p in victim_parts),
        "on_other_partitions": sum(n - 1 for (p, _), n in again.items() if p not in victim_parts),
        "consumed_three_times_or_more": sum(1 for n in again.values() if n > 2),
    }
    # Offsets per partition must run from 0 without holes (nothing skipped by a move).
    holes = {}
    for p in range(PARTITIONS):
        seen = sorted({o for (q, o) in counts if q == p})
        if seen and (seen[0] != 0 or len(seen) != seen[-1] + 1):
            holes[p] = {"first": seen[0], "last": seen[-1], "distinct": len(seen)}
    # How long the dead member's partitions went unconsumed: from the dead member's last batch
    # on each to the first batch a survivor consumed from it.
    unserved = {}
    for p in sorted(victim_parts):
        last_dead = max((t for name, t, q, _, _ in consumed if name == victim.name and q == p), default=None)
        first_new = min((t for name, t, q, _, _ in consumed if name != victim.name and q == p and t > t_kill), default=None)
        unserved[p] = r3(first_new - last_dead) if last_dead is not None and first_new is not None else None

    commit_failures = [
        {"member": e["member"], "at": r3(e["t"] - t_kill), "where": e["where"], "error": e.get("error") or e.get("errors")}
        for m in members
        for e in m.events()
        if e["ev"] == "commit_failed"
    ]
    problems = [
        {"member": e["member"], "at": r3(e["t"] - t_kill), **{k: v for k, v in e.items() if k not in ("t", "member")}}
        for m in members
        for e in m.events()
        if e["ev"] in ("error", "damaged")
    ]
    produced = next((e for e in reversed(producer.events()) if e["ev"] == "done"), None)
    return {
        "protocol": protocol,
        "victim": victim.name,
        "victim_partitions": sorted(victim_parts),
        "assignment_before": before,
        "assignment_after": after,
        "stable_before_kill_s": r3(t_kill - t_stable),
        "broker_session_expired_s": expired,
        "reassignment_s": r3(t_reassigned - t_kill),
        "first_callback_after_kill_s": first_callback,
        "dead_partitions_unconsumed_s": unserved,
        "survivors": per_survivor,
        "redelivered": redelivered,
        "offset_holes": holes,
        "messages_consumed": len(consumed),
        "commit_failures": commit_failures[:20],
        "commit_failures_total": len(commit_failures),
        "consumer_errors": problems[:20],
        "producer": produced,
        "timeline": timeline,
    }


# ---- the whole benchmark -------------------------------------------------------------------------


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ""


def table(results: list[dict]) -> str:
    rows = [
        ["protocol", "rep", "expired s", "reassigned s", "pause s", "near rebalance s", "normal gap s",
         "unowned s", "max latency s", "redelivered (dead/other)", "commit failures"]
    ]
    for r in results:
        if "error" in r:
            rows.append([r["protocol"], str(r["rep"]), "failed: " + r["error"].splitlines()[0][:60]] + [""] * 8)
            continue
        s = r["survivors"].values()

        def f(x):
            return "-" if x is None else f"{x:.2f}"

        rows.append(
            [
                r["protocol"],
                str(r["rep"]),
                f(r["broker_session_expired_s"]),
                f(r["reassignment_s"]),
                " / ".join(f(v["pause_s"]) for v in s),
                " / ".join(f(v["pause_near_rebalance_s"]) for v in s),
                " / ".join(f(v["baseline_max_gap_s"]) for v in s),
                " / ".join(f(v["kept_partitions_unowned_s"]) for v in s),
                " / ".join(f(v["latency_s"]["window_max"]) for v in s),
                f"{r['redelivered']['messages']} ({r['redelivered']['on_dead_members_partitions']}/{r['redelivered']['on_other_partitions']})",
                str(r["commit_failures_total"]),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each protocol (default 2)")
    ap.add_argument("--protocols", default="eager,cooperative,consumer", help="comma-separated, of: " + ", ".join(PROTOCOLS))
    ap.add_argument("--budget-s", type=float, default=345, help="skip runs that would end the benchmark later than this (default 345)")
    ap.add_argument("--results-dir", default=str(REPO / "perf" / "results"))
    ap.add_argument("--keep", action="store_true", help="keep broker data and member logs")
    args = ap.parse_args()
    protocols = [p for p in args.protocols.split(",") if p]
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown:
        ap.error(f"unknown protocols {unknown}")

    sys.path.insert(0, str(REPO / "tests" / "python"))
    import confluent_kafka
    from harness import SLUICE_BIN, TEST_DIR

    if not SLUICE_BIN.exists():
        print(f"{SLUICE_BIN} does not exist; build it with `cargo build -p sluice-broker`", file=sys.stderr)
        return 1

    t0 = now()
    date_utc = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    # Uncommitted changes to the broker's sources mean the figures are not the commit's.
    dirty = bool(git("status", "--porcelain", "--", "broker", "engine", "replication", "Cargo.toml"))
    TEST_DIR.mkdir(parents=True, exist_ok=True)
    workroot = TEST_DIR / f"rebalance-{date_utc}"
    workroot.mkdir(parents=True, exist_ok=True)
    loadavg_start = Path("/proc/loadavg").read_text().split()[:3]
    print(
        f"rebalance benchmark: {', '.join(protocols)} x {args.reps}, commit {commit}{' (dirty)' if dirty else ''}, "
        f"load average {' '.join(loadavg_start)}; logs under {workroot}",
        flush=True,
    )

    # Interleaved (eager, cooperative, consumer, eager, ...), so that load from elsewhere on the
    # machine touches every protocol alike as far as it can.
    plan = [(p, rep) for rep in range(1, args.reps + 1) for p in protocols]
    results, skipped = [], []
    took: dict[str, float] = {}
    interrupted = False
    for protocol, rep in plan:
        estimate = took.get(protocol, PROTOCOLS[protocol]["session_timeout_ms"] / 1000 + OVERHEAD_ESTIMATE_S)
        if now() - t0 + estimate > args.budget_s:
            print(f"[{now() - t0:6.1f} s] {protocol} #{rep}: skipped, about {estimate:.0f} s would pass the {args.budget_s:.0f} s budget", flush=True)
            skipped.append({"protocol": protocol, "rep": rep})
            continue
        run = Run(protocol, rep, workroot, t0, args.keep)
        failed = True
        started = now()
        try:
            result = run.execute()
            failed = False
        except KeyboardInterrupt:
            interrupted = True
            results.append({"protocol": protocol, "rep": rep, "error": "interrupted"})
        except Exception as e:
            traceback.print_exc()
            results.append({"protocol": protocol, "rep": rep, "error": f"{type(e).__name__}: {e}"})
        finally:
            run.cleanup(failed)
        took[protocol] = max(took.get(protocol, 0.0), now() - started)
        if not failed:
            results.append(result)
            s = result["survivors"]
            run.say(
                "reassignment {:.2f} s, pauses {}, redelivered {}".format(
                    result["reassignment_s"],
                    ", ".join(f"{k} {v['pause_s']} s" for k, v in s.items()),
                    result["redelivered"]["messages"],
                )
            )
        if interrupted:
            break
    if not args.keep and not any("error" in r for r in results):
        for d in sorted(workroot.glob("*/")):
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
        workroot.rmdir()

    loadavg_end = Path("/proc/loadavg").read_text().split()[:3]
    cpu_model = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")), "")
    binary = SLUICE_BIN.stat()
    doc = {
        "benchmark": "rebalance",
        "date_utc": date_utc,
        "commit": commit,
        "dirty": dirty,
        "script_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "machine": {
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model,
            "loadavg_start": " ".join(loadavg_start),
            "loadavg_end": " ".join(loadavg_end),
        },
        "broker": {
            "binary": str(SLUICE_BIN.relative_to(REPO)) if SLUICE_BIN.is_relative_to(REPO) else SLUICE_BIN.name,
            "binary_mtime_utc": datetime.fromtimestamp(binary.st_mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "args": ["--cores", "2", "--group-initial-rebalance-delay-ms", str(INITIAL_REBALANCE_DELAY_MS)],
        },
        "clients": {
            "confluent_kafka": confluent_kafka.version(),
            "librdkafka": confluent_kafka.libversion()[0],
        },
        "settings": {
            "partitions": PARTITIONS,
            "members": MEMBERS,
            "produce_rate_per_s": RATE,
            "settle_s": SETTLE_S,
            "pause_window_after_reassignment_s": AFTER_S,
            "commit": "synchronous after every batch; in the revoke callback, what was processed of the revoked partitions",
            "fetch.wait.max.ms": 100,
            "protocols": {
                k: {"what": v["what"], "client_config": v["config"], "session_timeout_ms": v["session_timeout_ms"],
                    "heartbeat_interval_ms": v["heartbeat_ms"]}
                for k, v in PROTOCOLS.items() if k in protocols
            },
        },
        "runs": results,
        "skipped": skipped,
        "total_seconds": round(now() - t0, 1),
    }
    out = None
    if any("error" not in r for r in results):  # nothing is written for a run with no figures
        out_dir = Path(args.results_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / f"rebalance-{date_utc}-{commit}.json"
        out.write_text(json.dumps(doc, indent=2) + "\n")

    print()
    print(table(results))
    print()
    print("Seconds from the SIGKILL. expired: the broker logs the dead member's session expired; reassigned: every")
    print("partition of the dead member is in a survivor's assign callback. Per survivor (a / b): pause, the longest")
    print("gap between consumed messages on the partitions it kept, from the kill to reassignment + 5 s; near")
    print("rebalance, the same from 1 s before the expiry; normal gap, the same over the 3 s before the kill;")
    print("unowned, revoke to re-assign of those partitions (eager only); max latency,")
    print("produce -> consume on them in the window. Redelivered: messages consumed twice (on the dead member's")
    print("partitions / on the others).")
    if skipped:
        print("skipped for time: " + ", ".join(f"{s['protocol']} #{s['rep']}" for s in skipped))
    print(f"load average {' '.join(loadavg_start)} at the start, {' '.join(loadavg_end)} at the end; {doc['total_seconds']} s")
    if out is not None:
        try:
            shown = out.relative_to(Path.cwd())
        except ValueError:
            shown = out
        print(f"results: {shown}")
    if interrupted:
        return 130
    return 0 if results and not any("error" in r for r in results) else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--member", "--producer"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the orchestrator stops its children
        try:
            code = (member_main if sys.argv[1] == "--member" else producer_main)(json.loads(sys.argv[2]))
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.exit(code)

    def interrupted(signum, frame):
        raise KeyboardInterrupt()

    # SIGTERM stops the benchmark as Ctrl-C does: every process it started is ended by PID.
    signal.signal(signal.SIGTERM, interrupted)
    sys.exit(main())
