"""Fixtures that run a real `sluice` broker for the client tests.

- `broker`: one broker per test module (`--cores 2`, so partitions are spread over two shards
  and requests cross between them), on a free 127.0.0.1 port and a fresh data directory.
- `fresh_broker`: one broker for a single test, for tests that restart or kill it;
  `unstarted_broker` is the same, not started yet.

A test module can set `BROKER_ARGS` (a list of extra command-line flags) for the brokers these
fixtures start for it.

Teardown sends SIGTERM to the process the fixture started (by PID; SIGKILL after 10 s) and
fails the test if the broker did not exit 0. A failing test's report carries the tail of the
broker's log.
"""

from __future__ import annotations

import pytest

from harness import Broker

CORES_DEFAULT = 2
NUM_PARTITIONS_DEFAULT = 3


def _module_args(request) -> list:
    """The test module's `BROKER_ARGS`: extra flags for the brokers started for it."""
    return list(getattr(request.module, "BROKER_ARGS", ()))


def _finish(broker: Broker, failed: bool) -> None:
    try:
        if broker.running():
            broker.stop_cleanly()
        panics = [line for line in broker.log_text().splitlines() if "panicked" in line]
        assert not panics, "the broker panicked:\n" + "\n".join(panics) + "\n" + broker.log_tail()
    except BaseException:
        print(f"broker files kept in {broker.root}")
        raise
    if failed:
        print(f"broker files kept in {broker.root}")
    else:
        broker.remove()


@pytest.fixture(scope="module")
def broker(request):
    b = Broker(
        cores=CORES_DEFAULT,
        num_partitions=NUM_PARTITIONS_DEFAULT,
        name=request.module.__name__,
        extra_args=_module_args(request),
    )
    request.node.stash[BROKERS_KEY] = request.node.stash.get(BROKERS_KEY, []) + [b]
    failed_before = request.session.testsfailed
    b.start()
    yield b
    _finish(b, request.session.testsfailed > failed_before)


@pytest.fixture
def unstarted_broker(request):
    """A broker for one test, on a fresh data directory, that the test starts itself."""
    b = Broker(
        cores=CORES_DEFAULT,
        num_partitions=NUM_PARTITIONS_DEFAULT,
        name=request.node.name[:40],
        extra_args=_module_args(request),
    )
    request.node.stash[BROKERS_KEY] = [b]
    yield b
    rep = request.node.stash.get(CALL_REPORT_KEY, None)
    _finish(b, rep is None or rep.failed)


@pytest.fixture
def fresh_broker(unstarted_broker):
    """A started broker for one test, for tests that restart or kill it."""
    unstarted_broker.start()
    return unstarted_broker


BROKERS_KEY = pytest.StashKey[list]()
CALL_REPORT_KEY = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.stash[CALL_REPORT_KEY] = rep
    if rep.failed:
        brokers = list(item.stash.get(BROKERS_KEY, []))
        module = item.getparent(pytest.Module)
        if module is not None:
            brokers += module.stash.get(BROKERS_KEY, [])
        for b in brokers:
            rep.sections.append((f"sluice log tail ({b.log_path})", b.log_tail()))


@pytest.fixture(scope="module")
def kafka_reference(request):
    """Apache Kafka 4.x for the module, with the module's `KAFKA_PROPS` (server properties)."""
    from reference import KafkaReference

    k = KafkaReference(dict(getattr(request.module, "KAFKA_PROPS", {})), name=request.module.__name__)
    failed_before = request.session.testsfailed
    try:
        k.start()
        yield k
    finally:
        k.stop()
        if request.session.testsfailed > failed_before:
            print(f"Kafka files kept in {k.root}")
        else:
            k.remove()
