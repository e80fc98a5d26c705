"""A full disk, for real, through the `sluice` binary and confluent-kafka: the broker's data
directory is on a small loop-mounted ext4 filesystem that a producer fills until the broker
refuses appends.

What it shows, in order:

1. Produce (acks=all, no retries) answers KAFKA_STORAGE_ERROR once the filesystem has no room
   for a partition's next segment, and nothing else: no other error, no timeout, no crash.
   Every acknowledged message has the next offset of its partition, in produce order.
2. While full: the process is alive, Metadata and ListOffsets answer, the same produce from
   another client is refused the same way, a consumer reads every acknowledged message back byte
   for byte at its acknowledged offset (and nothing else), and the broker's log says the disk is
   full. Then a SIGKILL while full: the broker recovers on the full disk, serves all of it and
   still refuses the produce the same way.
3. A filler file written before the broker started is deleted: producing succeeds again (the
   producer from before the crash carries on), at offsets continuing right after the last
   acknowledged ones.
4. After a SIGTERM restart and a SIGKILL restart on the same data, everything acknowledged is
   there: count, offsets, order, bytes; nothing missing, nothing twice; appends continue after
   the recovered end.

A second test restarts at zero free bytes: once the broker has hit the wall the same way, a
second filler file takes the filesystem's last free blocks (written until ENOSPC), and the broker
is SIGKILLed and started again on it. It must start, serve every acknowledged message exactly,
refuse the produce with KAFKA_STORAGE_ERROR and answer Metadata; once both fillers are deleted,
producing continues right after the last acknowledged offsets.

Needs root and loop devices (it mounts a filesystem); elsewhere it is skipped.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import re
import shutil
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import OffsetSpec

from harness import admin, consumer, create_topic, produce_all, producer, read_to_end, watermarks

TOPIC = "full-disk"
PARTITIONS = 2
# The scratch filesystem: about 58 MiB usable once ext4 has its journal and tables.
IMAGE_BYTES = 64 << 20
# Written before the broker starts, deleted once the broker has hit the wall.
FILLER_BYTES = 16 << 20
# Segments of 4 MiB are preallocated whole when created (the engine preallocates up to 16 MiB),
# so the wall is met when a partition rolls to a new segment.
SEGMENT_BYTES = 4 << 20
# Values of 32..64 KiB of incompressible bytes.
VALUE_MIN = 32 << 10
VALUE_MAX = 64 << 10
# Messages per produce round (split over the partitions); each round is flushed and checked.
ROUND = 16
# More bytes than fit on the filesystem: if none is refused by then, the disk never filled.
FILL_BYTES_MAX = 2 * IMAGE_BYTES
# Messages per partition produced once space is freed (about 2.3 MiB per partition: each
# partition needs a new 4 MiB segment, both fit in the 16 MiB freed).
AFTER_FREE_PER_PARTITION = 48
# Messages per partition after the SIGKILL restart.
AFTER_KILL_PER_PARTITION = 4
# The last free bytes are written in chunks of these sizes, each until ENOSPC, so the filesystem
# ends with no free block at all.
LAST_BYTES_CHUNKS = (1 << 20, 64 << 10, 4096, 512, 1)
# ext4 may give back a few blocks it had reserved for a write's metadata once the write is on
# disk: fill again, at most this many times, until statvfs says 0 bytes are free.
LAST_BYTES_ATTEMPTS = 5
# The broker's own settings: one `__consumer_offsets` partition (50 would preallocate 16 MiB
# each, far more than the filesystem holds) and a small batch cache, so that reads while the
# disk is full come from the segment files.
BROKER_TOML = '"offsets.topic.num.partitions" = 1\n"batch.cache.bytes" = 1048576\n'
# What the engine logs when a roll cannot create the next segment (engine/src/log/mod.rs).
DISK_FULL_LINE = "disk full: cannot create a new segment"

# No retries, so the broker's own answer reaches the delivery report; one message per batch, so
# a refused batch is exactly one message; a timeout well inside the test's budget, so a hang
# shows up as _MSG_TIMED_OUT instead of a stuck test.
FILL_PRODUCER = {
    "retries": 0,
    "batch.num.messages": 1,
    "linger.ms": 0,
    "message.timeout.ms": 15_000,
    "request.timeout.ms": 10_000,
}


# ---- the scratch filesystem --------------------------------------------------------------------


def _run(args: list[str]) -> subprocess.CompletedProcess:
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(args)} exited with {r.returncode}: {r.stderr.strip()}"
    return r


def _syncfs(path: Path) -> None:
    """Commits the filesystem holding `path` (ext4 reuses freed blocks once the journal has)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.syncfs(fd) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"syncfs {path}: {os.strerror(e)}")
    finally:
        os.close(fd)


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _take_last_free_bytes(path: Path) -> tuple[int, int]:
    """Creates `path` and writes to it until the filesystem refuses with ENOSPC, in ever smaller
    chunks down to one byte, then syncs; again while statvfs still shows free bytes (at most
    LAST_BYTES_ATTEMPTS times). Returns (bytes written, bytes free at the end)."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for _ in range(LAST_BYTES_ATTEMPTS):
            refused = None
            for chunk in LAST_BYTES_CHUNKS:
                data = os.urandom(chunk)
                while True:
                    try:
                        written += os.write(fd, data)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        refused = e
                        break
            assert refused is not None and refused.errno == errno.ENOSPC, (
                f"writing {path} never hit ENOSPC ({written} bytes written)"
            )
            os.fsync(fd)
            _syncfs(path.parent)
            free = _free_bytes(path.parent)
            if free == 0:
                break
    finally:
        os.close(fd)
    return written, free


@dataclass
class ScratchFs:
    image: Path
    device: str
    mount_point: Path


@pytest.fixture
def scratch_fs(request, tmp_path):
    """A fresh ext4 filesystem of IMAGE_BYTES on its own loop device, mounted under tmp_path.
    Teardown unmounts it and detaches that loop device (and no other); the image is deleted
    unless the test failed."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a scratch ext4 filesystem")
    if not Path("/dev/loop-control").exists():
        pytest.skip("no /dev/loop-control: no loop devices here")
    missing = [t for t in ("mkfs.ext4", "losetup", "mount", "umount") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")
    image = tmp_path / "fs.img"
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    with open(image, "wb") as f:
        f.truncate(IMAGE_BYTES)
    # No blocks reserved for root: the broker (root here) fills it like anyone else would.
    _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", str(image)])
    r = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot set up a loop device: {r.stderr.strip()}")
    device = r.stdout.strip()
    assert device.startswith("/dev/loop"), f"losetup named {device!r}"
    try:
        _run(["mount", "-t", "ext4", device, str(mount_point)])
    except BaseException:
        subprocess.run(["losetup", "-d", device], capture_output=True)
        raise
    failed_before = request.session.testsfailed
    try:
        yield ScratchFs(image, device, mount_point)
    finally:
        problems = []
        deadline = time.monotonic() + 5
        while True:
            r = subprocess.run(["umount", str(mount_point)], capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                # Something still holds a file there: detach lazily so it goes once let go.
                problems.append(f"umount {mount_point}: {r.stderr.strip()}; unmounted lazily")
                subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
                break
            time.sleep(0.1)
        r = subprocess.run(["losetup", "-d", device], capture_output=True, text=True)
        if r.returncode != 0:
            problems.append(f"losetup -d {device}: {r.stderr.strip()}")
        still = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout.strip()
        if still:
            problems.append(f"loop device still attached to the image: {still}")
        if not problems and request.session.testsfailed == failed_before:
            image.unlink()
        else:
            print(f"scratch filesystem image kept at {image}")
        assert not problems, "; ".join(problems)


# ---- messages ----------------------------------------------------------------------------------


def partition_of(seq: int) -> int:
    return seq % PARTITIONS


def key_of(seq: int) -> bytes:
    return b"key-%07d" % seq


def value_of(seq: int, size: int | None = None) -> bytes:
    """`seq` first, then incompressible bytes that depend only on `seq`."""
    if size is None:
        size = VALUE_MIN + (seq * 2_654_435_761) % (VALUE_MAX - VALUE_MIN + 1)
    head = b"%d|" % seq
    return head + random.Random(seq).randbytes(size - len(head))


def message(seq: int) -> dict:
    return {"partition": partition_of(seq), "key": key_of(seq), "value": value_of(seq)}


class Acked:
    """Every acknowledged message, per partition in offset order (index = offset)."""

    def __init__(self):
        self.seqs: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        self.value_bytes = 0

    def ends(self) -> dict[int, int]:
        return {p: len(s) for p, s in self.seqs.items()}

    def total(self) -> int:
        return sum(len(s) for s in self.seqs.values())

    def record(self, seq: int, report) -> None:
        p = partition_of(seq)
        assert report.partition == p, f"message {seq} acknowledged on partition {report.partition}, sent to {p}"
        assert report.offset == len(self.seqs[p]), (
            f"message {seq} acknowledged at offset {report.offset} of partition {p}; "
            f"the previous acknowledged offset there is {len(self.seqs[p]) - 1}"
        )
        self.seqs[p].append(seq)
        self.value_bytes += len(value_of(seq))


def produce_and_record(p, seqs: list[int], acked: Acked) -> list[tuple[int, KafkaError]]:
    """Produces `seqs` (flushed), records the acknowledged ones; returns (seq, error) of the rest."""
    reports = produce_all(p, TOPIC, [message(s) for s in seqs], flush_timeout=60)
    refused = []
    for s, r in zip(seqs, reports):
        if r.error is None:
            acked.record(s, r)
        else:
            refused.append((s, r.error))
    return refused


def read_back(bootstrap: str, acked: Acked, when: str) -> int:
    """Reads both partitions from 0 with a fresh consumer: exactly the acknowledged messages, at
    their acknowledged offsets, in produce order, byte for byte. Returns the bytes read."""
    c = consumer(bootstrap)
    try:
        marks = watermarks(c, TOPIC, PARTITIONS)
        ends = acked.ends()
        assert marks == {p: (0, ends[p]) for p in range(PARTITIONS)}, (
            f"{when}: watermarks {marks}, acknowledged per partition {ends}"
        )
        c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        msgs = read_to_end(c, {(TOPIC, p): ends[p] for p in range(PARTITIONS)}, timeout=30)
    finally:
        c.close()
    by_partition = defaultdict(list)
    for m in msgs:
        by_partition[m.partition()].append(m)
    read_bytes = 0
    for p in range(PARTITIONS):
        got = by_partition[p]
        offsets = [m.offset() for m in got]
        assert offsets == list(range(ends[p])), (
            f"{when}: partition {p} delivered {len(offsets)} messages for {ends[p]} acknowledged; "
            f"offsets are not 0..{ends[p] - 1} in order (first differences: "
            f"{[(i, o) for i, o in enumerate(offsets) if o != i][:5]})"
        )
        for m, seq in zip(got, acked.seqs[p]):
            if m.key() != key_of(seq) or m.value() != value_of(seq):
                head = (m.value() or b"")[:20]
                raise AssertionError(
                    f"{when}: partition {p} offset {m.offset()} should hold message {seq} "
                    f"({len(value_of(seq))} bytes), holds key {m.key()!r}, {len(m.value() or b'')} bytes "
                    f"starting {head!r}"
                )
            read_bytes += len(m.value())
    return read_bytes


def assert_refused(bootstrap: str, seq: int, when: str) -> None:
    """From a new producer, one message of the largest size to each partition (`seq`, `seq + 1`,
    ...): each must be refused with KAFKA_STORAGE_ERROR."""
    probe = producer(bootstrap, **FILL_PRODUCER)
    messages = [{"partition": p, "key": key_of(seq + p), "value": value_of(seq + p, VALUE_MAX)} for p in range(PARTITIONS)]
    reports = produce_all(probe, TOPIC, messages, flush_timeout=30)
    got = [r.error.name() if r.error is not None else f"acknowledged at offset {r.offset}" for r in reports]
    assert got == ["KAFKA_STORAGE_ERROR"] * PARTITIONS, f"{when}: produce answered {got} (partitions 0..{PARTITIONS - 1})"


def wait_for_log(broker, pattern: str, timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in broker.log_text().splitlines() if re.search(pattern, line)]
        if lines:
            return lines
        assert time.monotonic() < deadline, f"no line matching {pattern!r} in the broker's log\n{broker.log_tail()}"
        time.sleep(0.05)


def start_on_scratch_fs(fs: ScratchFs, broker) -> tuple[Path, int]:
    """Writes the filler file, starts the broker with its data directory on the scratch
    filesystem and creates the topic. Returns the filler's path and the bytes then free."""
    filler = fs.mount_point / "filler"
    with open(filler, "wb") as f:
        f.write(os.urandom(FILLER_BYTES))
        f.flush()
        os.fsync(f.fileno())
    config = broker.root / "sluice.toml"
    config.write_text(BROKER_TOML)
    broker.data_dir = fs.mount_point / "data"
    broker.extra_args += ["--config", str(config)]
    broker.start()
    create_topic(broker.bootstrap, TOPIC, PARTITIONS, {"segment.bytes": str(SEGMENT_BYTES)})
    return filler, _free_bytes(fs.mount_point)


def fill_to_the_wall(fill, acked: Acked, fs: ScratchFs) -> tuple[int, list[tuple[int, KafkaError]]]:
    """Produces rounds from message 0 until every partition has had a message refused; every
    refusal must be KAFKA_STORAGE_ERROR, every partition must have taken something and less than
    a segment may be left free. Returns the next unused message number and the refusals."""
    refused: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    errors = []
    seq = 0
    sent_bytes = 0
    while not all(refused.values()):
        assert sent_bytes < FILL_BYTES_MAX, (
            f"{sent_bytes} bytes produced ({acked.total()} acknowledged) and the disk never filled; "
            f"{_free_bytes(fs.mount_point)} bytes free"
        )
        seqs = list(range(seq, seq + ROUND))
        seq += ROUND
        sent_bytes += sum(len(value_of(s)) for s in seqs)
        for s, err in produce_and_record(fill, seqs, acked):
            refused[partition_of(s)].append(s)
            errors.append((s, err))
    wrong = [(s, e) for s, e in errors if e.code() != KafkaError.KAFKA_STORAGE_ERROR]
    assert not wrong, f"{len(wrong)} of {len(errors)} refusals were not KAFKA_STORAGE_ERROR, first: {wrong[:3]}"
    ends = acked.ends()
    assert all(ends.values()), f"a partition took nothing before the wall: {ends}"
    free = _free_bytes(fs.mount_point)
    assert free < SEGMENT_BYTES, f"refused with {free} bytes free, room for a segment"
    return seq, errors


def assert_metadata_and_offsets(bootstrap: str, ends: dict[int, int], when: str) -> None:
    """From a new admin client: Metadata names a broker and the topic with all its partitions;
    ListOffsets answers 0 (earliest) and `ends` (latest)."""
    other = admin(bootstrap)
    md = other.list_topics(topic=TOPIC, timeout=10)
    assert md.brokers, f"{when}: Metadata named no broker"
    assert md.topics[TOPIC].error is None, f"{when}: {md.topics[TOPIC].error}"
    assert sorted(md.topics[TOPIC].partitions) == list(range(PARTITIONS)), f"{when}: {md.topics[TOPIC].partitions}"
    for spec, want in ((OffsetSpec.earliest(), {p: 0 for p in range(PARTITIONS)}), (OffsetSpec.latest(), ends)):
        futures = other.list_offsets({TopicPartition(TOPIC, p): spec for p in range(PARTITIONS)}, request_timeout=10)
        got = {tp.partition: f.result(timeout=15).offset for tp, f in futures.items()}
        assert got == want, f"ListOffsets {when}: {got}, expected {want}"


# ---- the tests ---------------------------------------------------------------------------------


def test_full_disk_refuses_produce_serves_reads_and_recovers(scratch_fs, unstarted_broker):
    fs, broker = scratch_fs, unstarted_broker
    started = time.monotonic()
    filler, free_at_start = start_on_scratch_fs(fs, broker)

    # 1. Produce until every partition has had a message refused.
    acked = Acked()
    fill = producer(broker.bootstrap, **FILL_PRODUCER)
    seq, errors = fill_to_the_wall(fill, acked, fs)
    wall_error = errors[0][1]
    acked_at_wall = acked.total()
    acked_bytes_at_wall = acked.value_bytes
    ends_at_wall = acked.ends()
    free_at_wall = _free_bytes(fs.mount_point)

    # 2. While full.
    assert broker.running(), f"the broker died on a full disk\n{broker.log_tail()}"
    full_lines = wait_for_log(broker, re.escape(DISK_FULL_LINE))
    for p in range(PARTITIONS):
        assert any(re.search(rf"dir=\S*/{TOPIC}-{p}$", line) for line in full_lines), (
            f"no {DISK_FULL_LINE!r} line names partition {p}: {full_lines}"
        )
        wait_for_log(broker, rf"produce refused topic={TOPIC} partition={p} error=disk full: ")
    poisoned = [line for line in broker.log_text().splitlines() if "poisoned" in line]
    assert not poisoned, f"a full disk poisoned a log: {poisoned}"
    # Another client: Metadata and ListOffsets.
    assert_metadata_and_offsets(broker.bootstrap, ends_at_wall, "on a full disk")
    # Another producer: the largest message, which cannot fit where a smaller one was refused,
    # is refused again on every partition, twice, the same way.
    for attempt in range(2):
        assert_refused(broker.bootstrap, seq, f"attempt {attempt} on a full disk")
    seq += PARTITIONS
    # A consumer reads every acknowledged message, and only those.
    read_bytes = read_back(broker.bootstrap, acked, "on a full disk")
    assert read_bytes == acked_bytes_at_wall
    assert broker.running(), f"the broker died on a full disk\n{broker.log_tail()}"
    # A crash while full: the broker recovers on the full disk, serves everything, and still
    # refuses the produce the same way.
    broker.kill()
    broker.start()
    reopened = re.findall(rf"log opened dir=\S*/{TOPIC}-\d+ .*", broker.current_log())
    assert len(reopened) == PARTITIONS, f"partitions reopened on the full disk: {reopened}"
    read_back(broker.bootstrap, acked, "after a SIGKILL restart on the full disk")
    assert_refused(broker.bootstrap, seq, "after a SIGKILL restart on the full disk")
    seq += PARTITIONS

    # 3. Free space: producing works again, right after the last acknowledged offsets.
    filler.unlink()
    _syncfs(fs.mount_point)
    seqs = list(range(seq, seq + AFTER_FREE_PER_PARTITION * PARTITIONS))
    seq += len(seqs)
    failed = produce_and_record(fill, seqs, acked)
    assert not failed, f"{len(failed)} of {len(seqs)} messages refused after freeing space, first: {failed[:3]}"
    del fill
    ends_after_free = acked.ends()
    assert ends_after_free == {p: ends_at_wall[p] + AFTER_FREE_PER_PARTITION for p in range(PARTITIONS)}
    read_back(broker.bootstrap, acked, "after freeing space")

    # 4. Restarts on the same data: SIGTERM (exit 0, logs closed cleanly), then SIGKILL.
    broker.restart()
    reopened = re.findall(rf"log opened dir=\S*/{TOPIC}-\d+ .*", broker.current_log())
    assert len(reopened) == PARTITIONS, f"partitions reopened after SIGTERM: {reopened}"
    assert all("clean=true" in line for line in reopened), f"a cleanly closed log was recovered as unclean: {reopened}"
    read_back(broker.bootstrap, acked, "after a SIGTERM restart")
    broker.kill()
    broker.start()
    read_back(broker.bootstrap, acked, "after a SIGKILL restart")
    seqs = list(range(seq, seq + AFTER_KILL_PER_PARTITION * PARTITIONS))
    seq += len(seqs)
    tail = producer(broker.bootstrap, **FILL_PRODUCER)
    failed = produce_and_record(tail, seqs, acked)
    assert not failed, f"{len(failed)} messages refused after the SIGKILL restart, first: {failed[:3]}"
    del tail
    total_bytes = read_back(broker.bootstrap, acked, "at the end")
    assert acked.total() == acked_at_wall + (AFTER_FREE_PER_PARTITION + AFTER_KILL_PER_PARTITION) * PARTITIONS

    print(
        f"\nfull disk: {free_at_start} bytes free after the broker started; {acked_at_wall} messages "
        f"({acked_bytes_at_wall} value bytes) acknowledged before the wall, per partition {ends_at_wall}; "
        f"{free_at_wall} bytes free at the wall; {len(errors)} refused while filling, first error: "
        f"{wall_error.name()} ({wall_error.code()}): {wall_error.str()}; log: {full_lines[0].strip()}; "
        f"{acked.total()} messages ({total_bytes} value bytes) read back at the end; "
        f"{time.monotonic() - started:.1f} s"
    )


def test_restart_at_zero_free_bytes_serves_refuses_and_recovers(scratch_fs, unstarted_broker):
    fs, broker = scratch_fs, unstarted_broker
    started = time.monotonic()
    filler, free_at_start = start_on_scratch_fs(fs, broker)

    # 1. The wall, the normal way: produce refused with KAFKA_STORAGE_ERROR.
    acked = Acked()
    fill = producer(broker.bootstrap, **FILL_PRODUCER)
    seq, errors = fill_to_the_wall(fill, acked, fs)
    del fill
    ends_at_wall = acked.ends()
    free_at_wall = _free_bytes(fs.mount_point)

    # 2. The last free bytes go to a second filler: nothing is left, not one block.
    last = fs.mount_point / "filler-last"
    last_bytes, free_now = _take_last_free_bytes(last)
    assert free_now == 0, f"{free_now} bytes still free after writing {last} until ENOSPC"
    assert broker.running(), f"the broker died while the last free bytes went\n{broker.log_tail()}"

    # 3. A crash at zero free bytes, and a start on that filesystem.
    broker.kill()
    assert _free_bytes(fs.mount_point) == 0, "space came free between the fill and the restart"
    broker.start()
    # Recovery may give back a few blocks (a preallocated tail cut off): say how many.
    free_after_start = _free_bytes(fs.mount_point)
    when = f"after a SIGKILL restart at zero free bytes ({free_after_start} bytes free once started)"
    reopened = re.findall(rf"log opened dir=\S*/{TOPIC}-\d+ .*", broker.current_log())
    assert len(reopened) == PARTITIONS, f"partitions reopened {when}: {reopened}"
    read_back(broker.bootstrap, acked, when)
    for attempt in range(2):
        assert_refused(broker.bootstrap, seq, f"attempt {attempt} {when}")
    seq += PARTITIONS
    assert_metadata_and_offsets(broker.bootstrap, ends_at_wall, when)
    assert broker.running(), f"the broker died at zero free bytes\n{broker.log_tail()}"
    poisoned = [line for line in broker.current_log().splitlines() if "poisoned" in line]
    assert not poisoned, f"zero free bytes poisoned a log: {poisoned}"

    # 4. Both fillers deleted: producing continues right after the last acknowledged offsets.
    filler.unlink()
    last.unlink()
    _syncfs(fs.mount_point)
    seqs = list(range(seq, seq + AFTER_FREE_PER_PARTITION * PARTITIONS))
    seq += len(seqs)
    after = producer(broker.bootstrap, **FILL_PRODUCER)
    failed = produce_and_record(after, seqs, acked)
    assert not failed, f"{len(failed)} of {len(seqs)} messages refused after freeing space, first: {failed[:3]}"
    del after
    assert acked.ends() == {p: ends_at_wall[p] + AFTER_FREE_PER_PARTITION for p in range(PARTITIONS)}
    total_bytes = read_back(broker.bootstrap, acked, "at the end")

    print(
        f"\nzero free bytes: {free_at_start} bytes free after the broker started; per partition "
        f"{ends_at_wall} acknowledged before the wall ({len(errors)} refused); {free_at_wall} bytes "
        f"free at the wall; {last_bytes} more bytes written until ENOSPC left {free_now} free; "
        f"{free_after_start} bytes free once restarted; {acked.total()} messages ({total_bytes} value "
        f"bytes) read back at the end; {time.monotonic() - started:.1f} s"
    )
