#!/usr/bin/env python3
"""Share groups (KIP-932, issue 29): Sluice and Apache Kafka 4.4.0 side by side, in one run.

Workload: one topic of ONE partition, 16 KafkaShareConsumers in one share group (threads of one
JVM, perf/share/ShareBench.java), 1 KiB records, every record acknowledged on its own in explicit
mode (acknowledge(record, ACCEPT)) and each poll's batch committed with commitSync() before the
next poll. Two phases, each against a fresh broker on a fresh data directory:

  drain  the topic is pre-filled with --prefill records, then the 16 consumers drain it: records
         acknowledged per second over a steady window (from --warmup s after the first
         acknowledgement or 10 % of the backlog acknowledged, whichever is first, to --duration s
         later or 90 % acknowledged, whichever is first), then the rest is drained to check that
         every record was acknowledged.
  rate   the 16 consumers join first, then one producer sends at a fixed rate for --warmup +
         --duration s: records acknowledged per second, and end-to-end latency (the record's
         CreateTime to the return of the commitSync that acknowledged it) of the records produced
         in the measured window; then the backlog is drained to check completeness.

The fixed rate is --rate, or (default) 0.75x the lowest of the two brokers' drain rates and of
the producer's pre-fill rates in the first round of this run: the same rate for both brokers,
below what either's consumers drain and what the one producer pushes into either. On a 2-core
machine that rule's rate was too high for a backlog-free run (the producer, the consumers and
the broker then compete for the cores; see perf/README.md): give --rate for the latency profile.

Order: each round runs the drain phase on both brokers, then the rate phase on both, alternating
which goes first (round 1: drain sluice, kafka; rate kafka, sluice; round 2 the reverse). With
--reps 2 (default) that is 8 broker starts.

    perf/share_bench.py                       # 10 s warm-up + 30 s measured, 2 rounds: ~7 min
    perf/share_bench.py --phases rate --rate 4000 --warmup 20   # the latency profile: ~4 min
    perf/share_bench.py --quick               # a few seconds each, to check the benchmark itself

Needs target/release/sluice (`cargo build --release -p sluice-broker`; this script builds
nothing but ShareBench). If that binary is missing or older than the newest commit it falls back
to target/debug/sluice and says so in every output, because a debug broker's figures are not
comparable with anything. Apache Kafka 4.4.0 and HdrHistogram come from target/java-deps
(tests/java/fetch-deps). Sluice runs with --cores 2 (its default shape on this 2-core machine);
Kafka in KRaft combined mode with kafka-server-start.sh's 1 GiB heap and JVM flags. Both get their
data directories under target/perf/share/ (not tmpfs: Sluice writes with O_DIRECT).

Writes perf/results/share-<UTC date>-<short commit>.json (--quick: target/perf/share/quick-*.json,
never to be committed) and prints a markdown table. Stops every process it started, by PID. A
measurement, not a test: nothing fails on a figure.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "target"
DEPS = TARGET / "java-deps"
CLASSES = TARGET / "perf" / "share-classes"
WORK = TARGET / "perf" / "share"
SOURCE = ROOT / "perf" / "share" / "ShareBench.java"
RESULTS = ROOT / "perf" / "results"
BROKERS = ("sluice", "kafka")
CONSUMERS = 16
RECORD_BYTES = 1024
RATE_FRACTION = 0.75
KAFKA_START_S = 180
SLUICE_START_S = 60

STARTED: list[subprocess.Popen] = []


def log(msg):
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {port} after {seconds} s")


def cpu_seconds(pid):
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def rss_peak_mib(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def loadavg():
    return Path("/proc/loadavg").read_text().split()[:3]


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def commits_since(mtime):
    """The commits newer than a binary, each with the paths it touched."""
    newer = git("log", f"--since=@{int(mtime)}", "--format=%x00%h", "--name-only")
    commits = []
    for block in newer.split("\0")[1:]:
        lines = [l for l in block.splitlines() if l.strip()]
        if lines:
            commits.append(f"{lines[0]} touching {', '.join(lines[1:]) or 'nothing'}")
    return commits


def choose_sluice(explicit):
    """The release binary if it is at least as new as the newest commit; the debug one (said
    loudly) otherwise."""
    commit_ts = int(git("log", "-1", "--format=%ct") or 0)
    release = TARGET / "release" / "sluice"
    debug = TARGET / "debug" / "sluice"
    stamp = lambda p: datetime.datetime.fromtimestamp(p.stat().st_mtime, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    if explicit:
        p = Path(explicit).resolve()
        kind = "release" if "/release/" in str(p) else "debug" if "/debug/" in str(p) else "given"
        age = p.stat().st_mtime - commit_ts
        when = (f"{age:.0f} s after the newest commit" if age >= 0 else
                f"{-age:.0f} s BEFORE the newest commit (commits since it was built: "
                + "; ".join(commits_since(p.stat().st_mtime)) + ")")
        return p, kind, f"{p} (given with --sluice-bin; built {stamp(p)}, {when})"
    if release.exists() and release.stat().st_mtime >= commit_ts:
        return release, "release", f"target/release/sluice (built {stamp(release)}, not older than the newest commit)"
    why = "missing" if not release.exists() else f"older ({stamp(release)}) than the newest commit"
    if release.exists():
        commits = commits_since(release.stat().st_mtime)
        if commits:
            why += " (commits since it was built: " + "; ".join(commits) + ")"
    log(f"target/release/sluice is {why}: run `cargo build --release -p sluice-broker` for figures "
        "worth comparing")
    if not debug.exists():
        sys.exit("no target/debug/sluice either: build one (cargo build --release -p sluice-broker)")
    note = (f"target/debug/sluice (built {stamp(debug)}): DEBUG BUILD, target/release/sluice is {why}; "
            "Sluice's figures are not comparable")
    if debug.stat().st_mtime < commit_ts:
        note += f"; it predates the newest commit by {commit_ts - debug.stat().st_mtime:.0f} s"
    log(f"using {note}")
    return debug, "debug", note


def compile_bench():
    CLASSES.mkdir(parents=True, exist_ok=True)
    subprocess.run(["javac", "-Xlint:all", "-cp", f"{DEPS}/*", "-d", str(CLASSES), str(SOURCE)],
                   check=True, timeout=300)


class Broker:
    """One fresh broker process on its own port and data directory, stopped by PID."""

    def __init__(self, kind, name, sluice_bin):
        self.kind = kind
        self.dir = WORK / name
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.port = free_port()
        out = open(self.dir / "broker.log", "wb")
        t0 = time.time()
        if kind == "sluice":
            cmd = [str(sluice_bin), "--cores", "2", "--data-dir", str(self.dir / "data"),
                   "--listeners", f"PLAINTEXT://127.0.0.1:{self.port}",
                   "--group-initial-rebalance-delay-ms", "0"]
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=dict(os.environ, RUST_LOG="info"))
        else:
            cmd = self.kafka_command()
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()
        STARTED.append(self.proc)
        try:
            if kind == "sluice":
                wait_port(self.port, self.proc, SLUICE_START_S)
            else:
                wait_port(self.port, self.proc, KAFKA_START_S)
                # The port opens before the broker has registered with its own controller.
                deadline = time.time() + KAFKA_START_S
                server_log = self.dir / "server.log"
                while "Kafka Server started" not in (server_log.read_text(errors="replace") if server_log.exists() else ""):
                    if self.proc.poll() is not None or time.time() > deadline:
                        raise RuntimeError("Kafka did not start:\n" + self.log_tail())
                    time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.time() - t0
        log(f"{kind} pid {self.proc.pid} serving on 127.0.0.1:{self.port} after {self.start_s:.1f} s")

    def kafka_command(self):
        controller = free_port()
        props = self.dir / "server.properties"
        props.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers=127.0.0.1:{controller}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={self.dir / 'data'}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "",
        ]))
        # An id starting with '-' would be read as an option by kafka-storage's parser.
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        subprocess.run(self.java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props),
                                 "--standalone", heap="-Xmx256m"),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)
        return self.java("kafka.Kafka", str(props))

    def java(self, *args, heap=None):
        # kafka-server-start.sh's heap and kafka-run-class.sh's JVM flags; slf4j-simple (the
        # binding in target/java-deps) writes the broker's log, at INFO, to server.log.
        mem = [heap] if heap else ["-Xmx1G", "-Xms1G"]
        return ["java", *mem, "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
                "-Djava.awt.headless=true",
                f"-Dorg.slf4j.simpleLogger.logFile={self.dir / 'server.log'}",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-cp", f"{DEPS}/*", *args]

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines=30):
        out = []
        for name in ("broker.log", "server.log"):
            p = self.dir / name
            if p.exists():
                out += p.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(out)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                log(f"{self.kind} pid {self.proc.pid} did not stop in 90 s; SIGKILL")
                self.proc.kill()
                self.proc.wait()
        if self.proc in STARTED:
            STARTED.remove(self.proc)
        shutil.rmtree(self.dir / "data", ignore_errors=True)


def run_phase(kind, phase, rnd, args, sluice_bin, rate):
    name = f"{kind}-{phase}-r{rnd}"
    log(f"--- {name}: starting {kind}")
    load_before = loadavg()
    result = {"broker": kind, "phase": phase, "round": rnd, "loadavg_before": load_before}
    try:
        broker = Broker(kind, name, sluice_bin)
    except Exception as e:  # noqa: BLE001 - a broker that does not start is a result too
        log(f"{name}: the broker did not start: {e}")
        result["error"] = f"the broker did not start: {str(e)[-1500:]}"
        result["loadavg_after"] = loadavg()
        return result
    result["broker_start_s"] = round(broker.start_s, 1)
    try:
        cpu0 = cpu_seconds(broker.proc.pid)
        wall0 = time.time()
        if phase == "drain":
            max_s = 90 + args.prefill / 5000 + args.drain_timeout + 60
        else:
            max_s = 90 + 90 + args.warmup + args.duration + args.drain_timeout + 60
        cmd = ["java", "-Xms1g", "-Xmx2g", "-XX:+UseG1GC", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
               "-cp", f"{CLASSES}:{DEPS}/*", "ShareBench",
               "--bootstrap", broker.bootstrap, "--phase", phase, "--consumers", str(CONSUMERS),
               "--record-bytes", str(RECORD_BYTES), "--prefill", str(args.prefill),
               "--rate", str(rate or 0), "--warmup", str(args.warmup), "--duration", str(args.duration),
               "--drain-timeout", str(args.drain_timeout), "--max-seconds", str(int(max_s)),
               "--run-id", f"{rnd}{uuid.uuid4().hex[:6]}"]
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(broker.dir / "sharebench.err", "wb") as err:
            bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
            STARTED.append(bench)
            try:
                stdout, _ = bench.communicate(timeout=max_s + 60)
            except subprocess.TimeoutExpired:
                log(f"ShareBench pid {bench.pid} overran {max_s + 60:.0f} s; SIGKILL")
                bench.kill()
                stdout, _ = bench.communicate()
            STARTED.remove(bench)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.time() - wall0
        cpu1 = cpu_seconds(broker.proc.pid)
        lines = [l for l in stdout.decode(errors="replace").splitlines() if l.startswith("{")]
        if lines:
            result.update(json.loads(lines[-1]))
        else:
            result["error"] = f"ShareBench exited {bench.returncode} without a result"
        result["sharebench_exit"] = bench.returncode
        result["wall_s"] = round(wall, 1)
        if cpu0 is not None and cpu1 is not None:
            result["broker_cpu_s"] = round(cpu1 - cpu0, 1)
            result["broker_cores"] = round((cpu1 - cpu0) / wall, 2)
        result["client_cpu_s"] = round(ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime, 1)
        result["client_cores"] = round(result["client_cpu_s"] / wall, 2)
        result["broker_rss_peak_mib"] = rss_peak_mib(broker.proc.pid)
        result["sharebench_stderr_tail"] = (broker.dir / "sharebench.err").read_text(errors="replace").splitlines()[-15:]
    finally:
        broker.stop()
    result["loadavg_after"] = loadavg()
    result["broker_exit"] = broker.proc.returncode
    w = result.get("window") or {}
    log(f"{name}: {fmt(w.get('acked_per_s'), 0)} acked/s, e2e p99 "
        f"{fmt((result.get('latency_window') or {}).get('p99_ms'))} ms, complete={result.get('complete')}, "
        f"redelivered={result.get('deliveries_with_delivery_count_over_1')}, "
        f"exceptions={sum((result.get('exceptions') or {}).values())}, load {' '.join(result['loadavg_after'])}")
    return result


def fmt(v, digits=2):
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, (int, float)):
        if digits == 0 or (isinstance(v, int)):
            return f"{v:,.0f}"
        return f"{v:,.{digits}f}"
    return str(v)


def mean(xs):
    xs = [x for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool)]
    return statistics.fmean(xs) if xs else None


def table(runs, rate, binary_note):
    """One row per figure; the cells are each round's figure, the last column the ratio of the
    two brokers' means."""
    rounds = sorted({r["round"] for r in runs})

    def get(kind, phase, rnd, path):
        for r in runs:
            if r["broker"] == kind and r["phase"] == phase and r["round"] == rnd:
                v = r
                for k in path:
                    v = v.get(k) if isinstance(v, dict) else None
                return v
        return None

    rows = [
        ("drain", ("window", "acked_per_s"), "**drain: records acked/s** (steady window)", 0, True),
        ("drain", ("drain_all_records_per_s",), "drain: all records / first to last ack", 0, True),
        ("drain", ("prefill_records_per_s",), "drain: pre-fill produce rate, records/s", 0, True),
        ("drain", ("deliveries_with_delivery_count_over_1",), "drain: deliveries with deliveryCount > 1", 0, False),
        ("drain", ("offsets_acked_more_than_once",), "drain: offsets acked more than once", 0, False),
        ("drain", ("ack_error_records",), "drain: records in failed commitSyncs", 0, False),
        ("drain", ("complete",), "drain: every produced record acked", None, False),
        ("drain", ("commit_sync", "p99_ms"), "drain: commitSync p99 ms", 2, True),
        ("drain", ("records_per_nonempty_poll",), "drain: records per non-empty poll", 1, True),
        ("drain", ("broker_cores",), "drain: broker CPU, cores", 2, True),
        ("rate", ("window", "acked_per_s"), f"**rate: records acked/s** (producer at {rate:,.0f}/s)" if rate else "rate: records acked/s", 0, True),
        ("rate", ("sent_per_s",), "rate: producer's send rate, records/s", 0, True),
        ("rate", ("producer_max_behind_schedule_ms",), "rate: producer's most behind its schedule, ms", 0, True),
        ("rate", ("latency_window", "p50_ms"), "rate: end-to-end p50 ms", 2, True),
        ("rate", ("latency_window", "p99_ms"), "**rate: end-to-end p99 ms**", 2, True),
        ("rate", ("latency_window", "p999_ms"), "rate: end-to-end p99.9 ms", 2, True),
        ("rate", ("latency_window", "max_ms"), "rate: end-to-end max ms", 2, True),
        ("rate", ("backlog_at_producer_end",), "rate: unacked when the producer finished", 0, False),
        ("rate", ("deliveries_with_delivery_count_over_1",), "rate: deliveries with deliveryCount > 1", 0, False),
        ("rate", ("offsets_acked_more_than_once",), "rate: offsets acked more than once", 0, False),
        ("rate", ("ack_error_records",), "rate: records in failed commitSyncs", 0, False),
        ("rate", ("complete",), "rate: every produced record acked", None, False),
        ("rate", ("broker_cores",), "rate: broker CPU, cores", 2, True),
    ]
    head = ["figure"] + [f"{k} r{n}" for k in BROKERS for n in rounds] + ["sluice / kafka"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for phase, path, label, digits, ratio in rows:
        cells = []
        means = {}
        for k in BROKERS:
            vals = [get(k, phase, n, path) for n in rounds]
            means[k] = mean(vals)
            cells += [fmt(v, digits if digits is not None else 2) for v in vals]
        if all(c == "—" for c in cells):
            continue  # a phase this run left out
        r = "—"
        if ratio and means.get("sluice") is not None and means.get("kafka"):
            r = f"{means['sluice'] / means['kafka']:.3g}"
        out.append(f"| {label} | " + " | ".join(cells) + f" | {r} |")
    exc = []
    for r in runs:
        for k, v in (r.get("exceptions") or {}).items():
            exc.append(f"- {r['broker']} {r['phase']} r{r['round']}: {v} x `{k}`")
        if r.get("error"):
            exc.append(f"- {r['broker']} {r['phase']} r{r['round']}: **{r['error']}**")
    out.append("")
    out.append(f"Sluice binary: {binary_note}.")
    if exc:
        out.append("")
        out.append("Client exceptions and errors:")
        out += exc
    return "\n".join(out)


def stop_everything(*_):
    for p in list(STARTED):
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    sys.exit("stopped")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warmup", type=float, default=10, help="seconds before the measured window (10)")
    ap.add_argument("--duration", type=float, default=30, help="seconds measured (30)")
    ap.add_argument("--prefill", type=int, default=500_000, help="records the drain phase starts from (500000)")
    ap.add_argument("--rate", type=float, default=None,
                    help="the rate phase's producer, records/s; default 0.75x the lowest drain or pre-fill rate of round 1")
    ap.add_argument("--reps", type=int, default=2, help="rounds (2)")
    ap.add_argument("--phases", default="drain,rate")
    ap.add_argument("--drain-timeout", type=float, default=120,
                    help="seconds (from the consumers' start, or the producer's end) to acknowledge everything (120)")
    ap.add_argument("--sluice-bin", default=None, help="this binary rather than target/release/sluice")
    ap.add_argument("--quick", action="store_true", help="seconds of everything, to check the benchmark")
    args = ap.parse_args()
    if args.quick:
        args.warmup, args.duration, args.prefill, args.reps, args.drain_timeout = 2, 5, 100_000, 1, 60
    phases = [p for p in args.phases.split(",") if p]

    signal.signal(signal.SIGTERM, stop_everything)
    signal.signal(signal.SIGINT, stop_everything)
    sluice_bin, binary_kind, binary_note = choose_sluice(args.sluice_bin)
    # One copy for the whole run: a build in this tree meanwhile must not change the broker
    # between phases.
    WORK.mkdir(parents=True, exist_ok=True)
    copy = WORK / "sluice"
    shutil.copy2(sluice_bin, copy)
    sluice_source, sluice_bin = sluice_bin, copy
    if not (DEPS / "kafka_2.13-4.4.0.jar").exists() or not list(DEPS.glob("HdrHistogram-*.jar")):
        sys.exit("target/java-deps lacks Kafka 4.4.0 or HdrHistogram: run tests/java/fetch-deps")
    log("compiling perf/share/ShareBench.java")
    compile_bench()

    commit = git("rev-parse", "--short", "HEAD")
    started = datetime.datetime.now(datetime.timezone.utc)
    up_before = uptime()
    log(f"uptime before: {up_before}")
    runs = []
    rate = args.rate
    try:
        for rnd in range(1, args.reps + 1):
            order = list(BROKERS) if rnd % 2 == 1 else list(reversed(BROKERS))
            if "drain" in phases:
                for kind in order:
                    runs.append(run_phase(kind, "drain", rnd, args, sluice_bin, None))
            if "rate" in phases:
                if rate is None:
                    # Below what both brokers' consumers drained and what the one producer
                    # reached while pre-filling, so that neither side sets the rate.
                    drains = [(r.get("window") or {}).get("acked_per_s") for r in runs if r["phase"] == "drain"]
                    fills = [r.get("prefill_records_per_s") for r in runs if r["phase"] == "drain"]
                    limits = [d for d in drains + fills if d]
                    if not limits:
                        log("no drain rate measured and no --rate: skipping the rate phase")
                        phases.remove("rate")
                        continue
                    rate = round(RATE_FRACTION * min(limits), -1) or 10
                    log(f"rate phase at {rate:,.0f} records/s ({RATE_FRACTION}x the lowest of the drain and "
                        f"pre-fill rates, {min(limits):,.0f})")
                for kind in reversed(order):
                    runs.append(run_phase(kind, "rate", rnd, args, sluice_bin, rate))
    finally:
        for p in list(STARTED):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
    up_after = uptime()
    log(f"uptime after: {up_after}")
    md = table(runs, rate, binary_note)
    doc = {
        "benchmark": "share groups (issue 29)",
        "commit": commit,
        "tree_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "started_utc": started.isoformat(timespec="seconds"),
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sluice_binary": str(sluice_source.relative_to(ROOT)) if sluice_source.is_relative_to(ROOT) else str(sluice_source),
        "sluice_binary_mtime_utc": datetime.datetime.fromtimestamp(
            copy.stat().st_mtime, datetime.timezone.utc).isoformat(timespec="seconds"),
        "sluice_binary_kind": binary_kind,
        "sluice_binary_note": binary_note,
        "sluice_flags": "--cores 2 --group-initial-rebalance-delay-ms 0 (share settings at their defaults)",
        "kafka": "Apache Kafka 4.4.0 from target/java-deps, KRaft combined, 1 GiB heap, defaults plus "
                 "single-node replication factors (offsets, transaction state, share coordinator state)",
        "workload": {"partitions": 1, "consumers": CONSUMERS, "record_bytes": RECORD_BYTES,
                     "acknowledgement": "explicit, acknowledge(record, ACCEPT) per record, commitSync() per poll batch",
                     "group_configs": {"share.auto.offset.reset": "earliest", "share.assignment.interval.ms": "0"},
                     "producer": "Java producer defaults (acks=all, idempotent, linger.ms=5, batch.size=16384), no key",
                     "consumer": "KafkaShareConsumer defaults (max.poll.records=500), poll(100 ms)"},
        "warmup_s": args.warmup, "duration_s": args.duration, "prefill": args.prefill,
        "rate": rate, "rate_rule": "given" if args.rate else f"{RATE_FRACTION}x the lowest drain or pre-fill rate of round 1",
        "reps": args.reps, "quick": args.quick,
        "uptime_before": up_before, "uptime_after": up_after,
        "runs": runs,
        "table_md": md,
    }
    stamp = started.strftime("%Y-%m-%dT%H%M%SZ")
    if args.quick:
        path = WORK / f"quick-share-{stamp}-{commit}.json"
    else:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"share-{stamp}-{commit}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(md)
    print(f"\nuptime before: {up_before}\nuptime after:  {up_after}\nwritten: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
