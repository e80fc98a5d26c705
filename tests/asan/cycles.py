"""Start/kill cycles of a `sluice` built with AddressSanitizer, under load.

Each cycle starts the broker on the same data, lets it run for a random moment (often still
recovering or starting its shards, sometimes serving an idempotent producer), SIGKILLs it, and
reads its log: an AddressSanitizer report, an abort, a panic or an exit other than by SIGKILL
fails the run and keeps the log. Build and run (see tests/README.md):

    RUSTFLAGS=-Zsanitizer=address cargo +nightly build -p sluice-broker \\
        --target x86_64-unknown-linux-gnu --target-dir target/asan
    target/venv/bin/python tests/asan/cycles.py \\
        target/asan/x86_64-unknown-linux-gnu/debug/sluice target/asan-cycles 200
"""

import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

PAUSES = [0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 3.0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the broker did not listen within {seconds} s")


def main() -> int:
    binary, work, cycles = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else random.randrange(1 << 31)
    rng = random.Random(seed)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    port = free_port()
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", RUST_BACKTRACE="0")
    command = [binary, "--data-dir", str(work / "data"), "--listeners", f"PLAINTEXT://127.0.0.1:{port}", "--cores", "2"]
    print(f"{cycles} cycles, seed {seed}", flush=True)
    stop = threading.Event()
    sent = [0]
    # librdkafka's log lines (refused connections while the broker is down) are expected here.
    quiet = logging.getLogger("cycles.librdkafka")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False

    def load() -> None:
        # At most 2,000 keyed messages (about 2 MB) a second; delivery errors while the broker is down are expected.
        p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True, "linger.ms": 5,
                      "message.timeout.ms": 600_000, "logger": quiet})
        while not stop.is_set():
            for _ in range(100):
                try:
                    p.produce("cycles", key=b"%d" % sent[0], value=os.urandom(rng.randint(10, 2000)))
                    sent[0] += 1
                except BufferError:
                    break
            p.poll(0)
            time.sleep(0.05)

    bad = 0
    for i in range(cycles):
        log_path = work / f"broker-{i % 2}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            if i == 0:
                wait_port(port, proc)
                admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "logger": quiet})
                admin.create_topics([NewTopic("cycles", 8, 1)])["cycles"].result(30)
                threading.Thread(target=load, daemon=True).start()
                time.sleep(3)
            else:
                time.sleep(rng.choice(PAUSES) * 3)
            code = proc.poll()
            if code is None:
                proc.send_signal(signal.SIGKILL)
                code = proc.wait()
        text = log_path.read_text(errors="replace")
        if code != -signal.SIGKILL or any(m in text for m in ("AddressSanitizer", "malloc", "panicked")):
            bad += 1
            kept = work / f"bad-{i}.log"
            log_path.rename(kept)
            print(f"cycle {i}: exit {code}; log kept in {kept}", flush=True)
        if i % 20 == 19:
            print(f"{i + 1} cycles, {bad} bad, {sent[0]} messages sent", flush=True)
    stop.set()
    print(f"done: {cycles} cycles, {bad} bad, seed {seed}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
