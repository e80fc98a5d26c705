package sluice;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Properties;
import java.util.Random;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Exactly-once processing with Apache Kafka's Java client against a real Sluice broker this
 * program starts: {@link TxnApp} applications (separate JVMs, each a read_committed consumer in
 * one group and a transactional producer that sends the consumed offsets in its transactions)
 * copy 100,000 numbered input records to an output topic while this program SIGKILLs them at
 * random moments and restarts them, and SIGKILLs and restarts the broker once. Then:
 *
 * <ul>
 *   <li>the group's committed offsets are the input's end offsets;
 *   <li>a read_committed consumer of the output sees every input record's output exactly once,
 *       carrying that input's partition and offset, and nothing else; no record of a transaction
 *       an application aborted; every record of each transaction an application saw committed;
 *       and of every transaction either all its records or none;
 *   <li>a read_uncommitted consumer sees more: exactly the read_committed records plus the records
 *       of transactions that were aborted (every tenth on purpose, after a flush, so there always
 *       are some) or cut short by a kill, and all records of the transactions aborted on purpose;
 *   <li>no application failed fatally (only a dead predecessor is ever fenced).
 * </ul>
 *
 * <p>First, zombie fencing: a second producer with the same transactional.id fences the first,
 * whose next send and commitTransaction fail with the exceptions Apache Kafka 4.4 gives for it
 * (with transaction version 0 and 2 alike): {@code InvalidProducerEpochException} for the send and
 * the commit, an abortable error, then {@code ProducerFencedException}, fatal, for the
 * abortTransaction the application calls next. {@code sluice.TxnTest --fencing BOOTSTRAP} runs that
 * scenario alone against any broker.
 *
 * <p>Usage: {@code sluice.TxnTest SLUICE_BIN WORK_DIR}. Every check prints {@code PASS name} or
 * {@code FAIL name: why}; the last line is {@code java-txn: N passed, N failed}. Every process it
 * starts is killed by PID when it ends, also on failure or SIGTERM. The broker's data and
 * sluice.log and each application's log and stderr stay under WORK_DIR. {@code TXN_SEED} picks
 * the kill moments of an earlier run again (each run prints its seed).
 */
public final class TxnTest {
    static final int PARTITIONS = 4;
    static final int RECORDS = 100_000;
    static final int APPS = 2;
    static final int APP_KILLS = 4;
    /** Every tenth transaction of each application is aborted on purpose. */
    static final int ABORT_EVERY = 10;
    /**
     * Kills happen while this fraction of the input is committed, at random points in between.
     * The last leaves 40% of the input to the applications, paced by MIN_TXN_MS to at most
     * 4,000 records a second together: a kill waits for its application to open a transaction,
     * which it can only do while its partitions still have input.
     */
    static final double KILL_FROM = 0.08;
    static final double KILL_TO = 0.6;
    /** Each application begins a transaction (of up to 500 records) at most every this often. */
    static final long MIN_TXN_MS = 250;
    /** How long a kill may wait for its application to log that a transaction is open. */
    static final long MID_TXN_WAIT_MS = 8_000;
    /** Applications that exit by themselves are restarted, this often at most. */
    static final int UNEXPECTED_RESTARTS_MAX = 5;
    static final long CLASSIC_SESSION_MS = 6_000;
    static final int INITIAL_REBALANCE_DELAY_MS = 300;
    static final int TXN_TIMEOUT_MS = 15_000;
    static final String TRANSACTION_CLEANUP_INTERVAL_MS = "500";

    /** Bounds for a stuck broker or client; a passing run takes a fraction of these. */
    static final long DONE_MS = 150_000;
    static final long READ_MS = 30_000;
    static final long DRIVER_DEADLINE_MS = 240_000;

    static final long T0 = System.nanoTime();

    private final Path sluiceBin;
    private final Path work;
    private final List<Process> spawned = Collections.synchronizedList(new ArrayList<>());
    private final List<String> lines = new ArrayList<>();
    private int passed;
    private int failed;

    private TxnTest(Path sluiceBin, Path work) {
        this.sluiceBin = sluiceBin;
        this.work = work;
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 2 && args[0].equals("--fencing")) {
            TxnTest t = new TxnTest(null, null);
            try {
                t.fencing(args[1]);
            } catch (Exception e) {
                t.fail("fencing: ran to the end", "threw " + e);
            }
            t.flush();
            System.out.printf("java-txn: %d passed, %d failed%n", t.passed, t.failed);
            System.exit(t.failed == 0 ? 0 : 1);
        }
        if (args.length != 2) {
            System.err.println("usage: sluice.TxnTest SLUICE_BIN WORK_DIR | sluice.TxnTest --fencing BOOTSTRAP");
            System.exit(2);
        }
        TxnTest t = new TxnTest(Path.of(args[0]), Path.of(args[1]));
        Files.createDirectories(t.work);
        // Whatever happens (a failure, SIGTERM from `timeout`), no application or broker outlives this.
        Runtime.getRuntime().addShutdownHook(new Thread(t::killEverything, "kill-spawned"));
        Thread deadline = new Thread(() -> {
            try {
                Thread.sleep(DRIVER_DEADLINE_MS);
            } catch (InterruptedException e) {
                return;
            }
            synchronized (System.out) {
                t.flush();
                System.out.println("FAIL txn: finished within " + DRIVER_DEADLINE_MS / 1000 + " s: still running; stopping");
                System.out.println("java-txn: " + t.passed + " passed, " + (t.failed + 1) + " failed");
                System.out.flush();
            }
            Runtime.getRuntime().exit(1);
        }, "deadline");
        deadline.setDaemon(true);
        deadline.start();
        t.runAll();
        synchronized (System.out) {
            t.flush();
            System.out.printf("java-txn: %d passed, %d failed%n", t.passed, t.failed);
        }
        System.exit(t.failed == 0 ? 0 : 1);
    }

    private void killEverything() {
        List<Process> all;
        synchronized (spawned) {
            all = new ArrayList<>(spawned);
        }
        for (Process p : all) {
            if (p.isAlive()) {
                p.destroyForcibly();
            }
        }
        for (Process p : all) {
            try {
                p.waitFor(5, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
    }

    // ---------------------------------------------------------------- checks

    /** A failed step: what follows it cannot run. */
    static final class Failure extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Failure(String why) {
            super(why);
        }
    }

    private synchronized void pass(String name) {
        passed++;
        lines.add("PASS txn " + name);
    }

    private synchronized void fail(String name, String why) {
        failed++;
        lines.add("FAIL txn " + name + ": " + why);
    }

    /** A check that passes when {@code why} is null. */
    private boolean check(String name, String why) {
        if (why == null) {
            pass(name);
        } else {
            fail(name, why);
        }
        return why == null;
    }

    private boolean checkEquals(String name, Object expected, Object actual) {
        return check(name, Objects.equals(expected, actual) ? null : "expected <" + expected + "> but got <" + actual + ">");
    }

    private synchronized void note(String line) {
        lines.add("  txn " + line);
    }

    /** Prints what was checked so far. */
    private synchronized void flush() {
        synchronized (System.out) {
            for (String l : lines) {
                System.out.println(l);
            }
            System.out.flush();
            lines.clear();
        }
    }

    static String describe(Throwable e) {
        Throwable c = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
        StringBuilder where = new StringBuilder();
        for (StackTraceElement el : c.getStackTrace()) {
            if (el.getClassName().startsWith("sluice.")) {
                where.append(" at ").append(el.getMethodName()).append(':').append(el.getLineNumber());
                break;
            }
        }
        return c + where.toString();
    }

    private void runAll() {
        Broker broker;
        try {
            broker = new Broker(work.resolve("broker"));
            broker.start();
        } catch (Exception e) {
            fail("start a broker", describe(e));
            return;
        }
        note("sluice pid " + broker.proc.pid() + " on " + broker.bootstrap() + ", data in " + broker.dir);
        long start = System.nanoTime();
        try {
            fencing(broker.bootstrap());
        } catch (Throwable e) {
            fail("fencing: ran to the end", e instanceof Failure ? e.getMessage() : "threw " + describe(e));
        }
        note(String.format("fencing took %.1f s", (System.nanoTime() - start) / 1e9));
        flush();
        start = System.nanoTime();
        try {
            exactlyOnce(broker);
        } catch (Throwable e) {
            fail("exactly-once: ran to the end", e instanceof Failure ? e.getMessage() : "threw " + describe(e));
        } finally {
            for (App a : apps) {
                a.destroy();
            }
        }
        note(String.format("exactly-once took %.1f s", (System.nanoTime() - start) / 1e9));
        if (broker.proc != null) {
            int status = broker.stop();
            checkEquals("broker exits 0 on SIGTERM", 0, status);
        }
        List<String> errors = broker.logErrors();
        check("broker log free of panics and errors", errors.isEmpty() ? null
            : errors.subList(0, Math.min(5, errors.size())).toString());
    }

    // ---------------------------------------------------------------- the broker

    final class Broker {
        final Path dir;
        final Path log;
        int port;
        Process proc;

        Broker(Path dir) throws IOException {
            this.dir = dir;
            this.log = dir.resolve("sluice.log");
            Files.createDirectories(dir);
        }

        String bootstrap() {
            return "127.0.0.1:" + port;
        }

        /** Starts on a free port the first time, on the same port (and data) after that. */
        void start() throws Exception {
            boolean again = port != 0;
            for (int attempt = 1; attempt <= 5; attempt++) {
                if (!again) {
                    try (ServerSocket ss = new ServerSocket(0, 1, InetAddress.getByName("127.0.0.1"))) {
                        port = ss.getLocalPort();
                    }
                }
                ProcessBuilder pb = new ProcessBuilder(sluiceBin.toString(), "--data-dir", dir.resolve("data").toString(),
                    "--listeners", "PLAINTEXT://127.0.0.1:" + port, "--cores", "1",
                    "--group-initial-rebalance-delay-ms", String.valueOf(INITIAL_REBALANCE_DELAY_MS),
                    "--transaction-abort-timed-out-transaction-cleanup-interval-ms", TRANSACTION_CLEANUP_INTERVAL_MS);
                pb.redirectErrorStream(true);
                pb.redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile()));
                proc = pb.start();
                spawned.add(proc);
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
                while (proc.isAlive() && System.nanoTime() < deadline && !listening(port)) {
                    Thread.sleep(100);
                }
                if (proc.isAlive() && listening(port)) {
                    return;
                }
                kill();
                if (again && attempt >= 3) {
                    break;
                }
            }
            throw new Failure("sluice did not start on " + bootstrap() + "; log tail: " + tail(log, 600));
        }

        /** SIGTERM by PID; its exit status, or -1 after a SIGKILL when it ignored that for 15 s. */
        int stop() {
            if (proc == null) {
                return -1;
            }
            proc.destroy();
            try {
                if (!proc.waitFor(15, TimeUnit.SECONDS)) {
                    kill();
                    return -1;
                }
                return proc.exitValue();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                kill();
                return -1;
            } finally {
                proc = null;
            }
        }

        /** SIGKILL by PID. */
        void kill() {
            if (proc == null) {
                return;
            }
            proc.destroyForcibly();
            try {
                proc.waitFor(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            proc = null;
        }

        List<String> logErrors() {
            List<String> out = new ArrayList<>();
            try {
                for (String l : Files.readAllLines(log, StandardCharsets.UTF_8)) {
                    if (l.contains("panicked") || l.contains("ERROR")) {
                        out.add(l);
                    }
                }
            } catch (IOException e) {
                out.add("cannot read " + log + ": " + e);
            }
            return out;
        }
    }

    static boolean listening(int port) {
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress("127.0.0.1", port), 200);
            return true;
        } catch (IOException e) {
            return false;
        }
    }

    static String tail(Path p, int chars) {
        try {
            String s = Files.readString(p, StandardCharsets.UTF_8);
            return s.length() <= chars ? s : s.substring(s.length() - chars);
        } catch (IOException e) {
            return "(" + e + ")";
        }
    }

    static String secs(long nanos) {
        return String.format("%.3fs", (nanos - T0) / 1e9);
    }

    // ---------------------------------------------------------------- plain clients

    static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        return Admin.create(p);
    }

    static void createTopic(Admin admin, String topic, int partitions) throws Exception {
        admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get(30, TimeUnit.SECONDS);
    }

    static KafkaProducer<String, String> transactionalProducer(String bootstrap, String transactionalId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        return new KafkaProducer<>(p);
    }

    static KafkaConsumer<String, String> reader(String bootstrap, String isolation) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        return new KafkaConsumer<>(p);
    }

    /** The log end offsets of every partition (ListOffsets, read_uncommitted). */
    static Map<Integer, Long> logEndOffsets(Admin admin, String topic, int partitions) throws Exception {
        Map<TopicPartition, OffsetSpec> q = new HashMap<>();
        for (int p = 0; p < partitions; p++) {
            q.put(new TopicPartition(topic, p), OffsetSpec.latest());
        }
        Map<Integer, Long> out = new TreeMap<>();
        admin.listOffsets(q, new ListOffsetsOptions(IsolationLevel.READ_UNCOMMITTED)).all().get(30, TimeUnit.SECONDS)
            .forEach((tp, info) -> out.put(tp.partition(), info.offset()));
        return out;
    }

    /** The group's committed offsets (OffsetFetch through Admin), -1 where there is none. */
    static Map<Integer, Long> groupOffsets(Admin admin, String group, String topic, int partitions) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> got = admin.listConsumerGroupOffsets(group)
            .partitionsToOffsetAndMetadata().get(10, TimeUnit.SECONDS);
        Map<Integer, Long> out = new TreeMap<>();
        for (int p = 0; p < partitions; p++) {
            OffsetAndMetadata om = got.get(new TopicPartition(topic, p));
            out.put(p, om == null ? -1L : om.offset());
        }
        return out;
    }

    /**
     * Every record of the topic from the beginning, read with the given isolation level until the
     * consumer's position reaches the log end offset of each partition: a read_committed consumer
     * gets there only when no transaction is open. Fails after {@link #READ_MS}.
     */
    static List<ConsumerRecord<String, String>> readAll(String bootstrap, String topic, String isolation,
                                                        Map<Integer, Long> ends) {
        List<ConsumerRecord<String, String>> out = new ArrayList<>();
        try (KafkaConsumer<String, String> c = reader(bootstrap, isolation)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int p : ends.keySet()) {
                tps.add(new TopicPartition(topic, p));
            }
            c.assign(tps);
            c.seekToBeginning(tps);
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(READ_MS);
            while (true) {
                boolean done = true;
                Map<Integer, Long> at = new TreeMap<>();
                for (TopicPartition tp : tps) {
                    long pos = c.position(tp, Duration.ofSeconds(10));
                    at.put(tp.partition(), pos);
                    done &= pos >= ends.get(tp.partition());
                }
                if (done) {
                    return out;
                }
                if (System.nanoTime() > deadline) {
                    throw new Failure(isolation + " consumer of " + topic + " did not reach the log end offsets " + ends
                        + " within " + READ_MS / 1000 + " s: positions " + at + " after " + out.size() + " records");
                }
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    out.add(r);
                }
            }
        }
    }

    // ---------------------------------------------------------------- 1: zombie fencing

    /**
     * Two producers with one transactional.id: the second's initTransactions fences the first,
     * whose open transaction is aborted; the first's next send (to the partition it already wrote
     * in that transaction), its commitTransaction and its abortTransaction fail, with the
     * exceptions Apache Kafka 4.4 gives (checked against it with transaction.version 0 and 2).
     */
    private void fencing(String bootstrap) throws Exception {
        String topic = "fencing-" + Long.toHexString(System.nanoTime() & 0xffffff);
        String id = "txn-zombie-" + topic;
        try (Admin admin = admin(bootstrap)) {
            createTopic(admin, topic, 1);
        }
        List<String> zombie = new ArrayList<>();
        List<String> good = new ArrayList<>();
        try (KafkaProducer<String, String> first = transactionalProducer(bootstrap, id)) {
            first.initTransactions();
            first.beginTransaction();
            for (int i = 0; i < 3; i++) {
                zombie.add("zombie-" + i);
                first.send(new ProducerRecord<>(topic, 0, "k", "zombie-" + i));
            }
            first.flush();
            try (KafkaProducer<String, String> second = transactionalProducer(bootstrap, id)) {
                second.initTransactions();

                Throwable sendError = null;
                zombie.add("after-fencing");
                try {
                    first.send(new ProducerRecord<>(topic, 0, "k", "after-fencing")).get(30, TimeUnit.SECONDS);
                } catch (ExecutionException e) {
                    sendError = e.getCause();
                } catch (KafkaException e) {
                    sendError = e;
                }
                check("fencing: the fenced producer's next send fails with InvalidProducerEpochException",
                    sendError != null && sendError.getClass().getSimpleName().equals("InvalidProducerEpochException") ? null
                        : "got " + (sendError == null ? "no error" : sendError.toString()));
                Throwable commitError = null;
                try {
                    first.commitTransaction();
                } catch (KafkaException e) {
                    commitError = e;
                }
                check("fencing: then its commitTransaction fails with InvalidProducerEpochException",
                    commitError != null && commitError.getClass().getSimpleName().equals("InvalidProducerEpochException") ? null
                        : "got " + (commitError == null ? "no error" : commitError.toString()));
                // An abortable error: the application aborts, and learns from the coordinator
                // that it is fenced, a fatal error.
                Throwable abortError = null;
                try {
                    first.abortTransaction();
                } catch (KafkaException e) {
                    abortError = e;
                }
                check("fencing: then its abortTransaction fails with ProducerFencedException",
                    abortError != null && abortError.getClass().getSimpleName().equals("ProducerFencedException") ? null
                        : "got " + (abortError == null ? "no error" : abortError.toString()));

                second.beginTransaction();
                for (int i = 0; i < 3; i++) {
                    good.add("good-" + i);
                    second.send(new ProducerRecord<>(topic, 0, "k", "good-" + i));
                }
                second.commitTransaction();
                pass("fencing: the new producer commits a transaction");

                // Transaction version 2 (KIP-890, Kafka 4's default): every end bumps the
                // producer epoch, so two more commits move it on by two.
                int epoch = producerEpoch(bootstrap, id);
                for (int t = 0; t < 2; t++) {
                    second.beginTransaction();
                    good.add("more-" + t);
                    second.send(new ProducerRecord<>(topic, 0, "k", "more-" + t));
                    second.commitTransaction();
                }
                checkEquals("fencing: at transaction version 2 each commit bumps the producer epoch",
                    epoch + 2, producerEpoch(bootstrap, id));
            }
        }
        Map<Integer, Long> ends;
        try (Admin admin = admin(bootstrap)) {
            ends = logEndOffsets(admin, topic, 1);
        }
        List<String> committed = new ArrayList<>();
        for (var r : readAll(bootstrap, topic, "read_committed", ends)) {
            committed.add(r.value());
        }
        checkEquals("fencing: read_committed sees only the new producer's records", good, committed);
        List<String> all = new ArrayList<>();
        for (var r : readAll(bootstrap, topic, "read_uncommitted", ends)) {
            all.add(r.value());
        }
        List<String> zombieInLog = new ArrayList<>(all);
        zombieInLog.removeAll(good);
        check("fencing: read_uncommitted sees the fenced transaction's records, but none sent after the fencing",
            zombieInLog.equals(zombie.subList(0, 3)) ? null : "records other than the new producer's: " + zombieInLog);
    }

    /** The producer epoch the transaction coordinator holds for {@code transactionalId}. */
    static int producerEpoch(String bootstrap, String transactionalId) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            return admin.describeTransactions(List.of(transactionalId)).description(transactionalId)
                .get(30, TimeUnit.SECONDS).producerEpoch();
        }
    }

    // ---------------------------------------------------------------- 2: exactly once under kills

    /** One run of a {@link TxnApp} (an incarnation of an application slot). */
    final class App {
        final int slot;
        final String name;
        final Path log;
        final Path err;
        final Process proc;
        volatile boolean killed;
        private final List<String[]> events = new ArrayList<>();
        private long pos;

        App(Path dir, int slot, int incarnation, String bootstrap, String group, String in, String out, Path stop)
            throws IOException {
            this.slot = slot;
            this.name = "app" + slot + "-" + incarnation;
            this.log = dir.resolve(name + ".log");
            this.err = dir.resolve(name + ".stderr");
            List<String> cmd = new ArrayList<>(List.of(
                Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-Dorg.slf4j.simpleLogger.showDateTime=true"));
            String extra = System.getenv("JAVA_TXN_APP_OPTS");
            if (extra != null && !extra.isBlank()) {
                cmd.addAll(Arrays.asList(extra.trim().split("\\s+")));
            }
            cmd.addAll(List.of("-cp", System.getProperty("java.class.path"), TxnApp.class.getName(),
                bootstrap, group, in, out, name, "txn-app-" + slot, log.toString(), stop.toString(),
                String.valueOf(ABORT_EVERY),
                "session.timeout.ms=" + CLASSIC_SESSION_MS, "heartbeat.interval.ms=1000", "max.poll.records=500",
                "app.min.txn.ms=" + MIN_TXN_MS,
                "producer.transaction.timeout.ms=" + TXN_TIMEOUT_MS, "producer.max.block.ms=10000",
                "producer.request.timeout.ms=10000", "producer.delivery.timeout.ms=30000"));
            ProcessBuilder pb = new ProcessBuilder(cmd);
            pb.redirectErrorStream(true);
            pb.redirectOutput(ProcessBuilder.Redirect.appendTo(err.toFile()));
            pb.redirectInput(ProcessBuilder.Redirect.from(new java.io.File("/dev/null")));
            this.proc = pb.start();
            spawned.add(proc);
        }

        /** Every complete line logged so far, split on spaces (read incrementally). */
        synchronized List<String[]> events() {
            try (RandomAccessFile f = new RandomAccessFile(log.toFile(), "r")) {
                long len = f.length();
                if (len > pos) {
                    byte[] buf = new byte[(int) (len - pos)];
                    f.seek(pos);
                    f.readFully(buf);
                    int end = buf.length;
                    while (end > 0 && buf[end - 1] != '\n') {
                        end--;
                    }
                    for (String line : new String(buf, 0, end, StandardCharsets.UTF_8).split("\n")) {
                        if (!line.isEmpty()) {
                            events.add(line.split(" "));
                        }
                    }
                    pos += end;
                }
            } catch (java.io.FileNotFoundException e) {
                return new ArrayList<>(events);
            } catch (IOException e) {
                throw new Failure("cannot read " + log + ": " + e);
            }
            return new ArrayList<>(events);
        }

        String lastEvent() {
            List<String[]> es = events();
            return es.isEmpty() ? "(nothing)" : es.get(es.size() - 1)[1];
        }

        String lastLine() {
            List<String[]> es = events();
            return es.isEmpty() ? "(nothing)" : String.join(" ", Arrays.copyOfRange(es.get(es.size() - 1), 1, es.get(es.size() - 1).length));
        }

        /** Records in the transactions this run logged as committed. */
        long committedRecords() {
            long n = 0;
            for (String[] e : events()) {
                if (e[1].equals("committed")) {
                    n += Long.parseLong(e[3]);
                }
            }
            return n;
        }

        /** SIGKILL to this application's PID. */
        void kill() throws InterruptedException {
            killed = true;
            proc.destroyForcibly();
            if (!proc.waitFor(10, TimeUnit.SECONDS)) {
                throw new Failure("application " + name + " (pid " + proc.pid() + ") survived SIGKILL for 10 s");
            }
        }

        String stderr() {
            String s = tail(err, 600).trim();
            return s.isEmpty() ? "(no output from " + name + ")" : "--- " + name + " stderr tail: " + s.replace('\n', '|');
        }

        void destroy() {
            if (proc.isAlive()) {
                proc.destroyForcibly();
                try {
                    proc.waitFor(10, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
        }
    }

    private final List<App> apps = Collections.synchronizedList(new ArrayList<>());

    /** Produces the numbered input records (idempotent producer) and keeps where each landed. */
    static void produceInput(String bootstrap, String topic, int[] partition, long[] offset) throws Exception {
        Arrays.fill(partition, -1);
        AtomicInteger errors = new AtomicInteger();
        AtomicReference<Exception> firstError = new AtomicReference<>();
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < partition.length; i++) {
                final int id = i;
                producer.send(new ProducerRecord<>(topic, "k" + (i % 1009), TxnApp.inputValue(i)), (md, e) -> {
                    if (e != null) {
                        errors.incrementAndGet();
                        firstError.compareAndSet(null, e);
                    } else {
                        partition[id] = md.partition();
                        offset[id] = md.offset();
                    }
                });
            }
            producer.flush();
        }
        if (errors.get() > 0) {
            throw new Failure(errors.get() + " input sends failed, first: " + firstError.get());
        }
    }

    /** A planned kill: of the broker (slot -1) or an application slot, at a fraction of the input committed. */
    record Kill(double at, int slot) {
    }

    /** One transaction as its application logged it. */
    static final class Txn {
        long count = -1;
        String end = "open";
        String error = "";
    }

    private void exactlyOnce(Broker broker) throws Exception {
        Path dir = work.resolve("eos");
        Files.createDirectories(dir);
        String in = "eos-in";
        String out = "eos-out";
        String group = "eos-app";
        String seedEnv = System.getenv("TXN_SEED");
        long seed = seedEnv != null && !seedEnv.isBlank() ? Long.parseLong(seedEnv.trim()) : System.nanoTime();
        Random rnd = new Random(seed);
        note("TXN_SEED=" + seed);

        // The input: 100,000 keyed records, ids 0..99,999, and where each one landed.
        int[] partition = new int[RECORDS];
        long[] offset = new long[RECORDS];
        Map<Integer, Long> inEnds;
        String b = broker.bootstrap();
        try (Admin admin = admin(b)) {
            createTopic(admin, in, PARTITIONS);
            createTopic(admin, out, PARTITIONS);
            long t = System.nanoTime();
            produceInput(b, in, partition, offset);
            inEnds = logEndOffsets(admin, in, PARTITIONS);
            note(String.format("input produced in %.1f s, end offsets %s", (System.nanoTime() - t) / 1e9, inEnds));
        }
        String why = null;
        Map<Long, Integer> landed = new HashMap<>();
        for (int i = 0; i < RECORDS && why == null; i++) {
            if (partition[i] < 0) {
                why = "record " + i + " was never acknowledged";
            } else if (landed.put(((long) partition[i] << 40) | offset[i], i) != null) {
                why = "two records were acknowledged at " + partition[i] + "@" + offset[i];
            }
        }
        long inTotal = inEnds.values().stream().mapToLong(Long::longValue).sum();
        if (why == null && inTotal != RECORDS) {
            why = "the input's end offsets add up to " + inTotal;
        }
        if (!check("exactly-once: " + RECORDS + " input records acknowledged, each at its own offset", why)) {
            return;
        }

        // The plan: APP_KILLS application kills and one broker kill at random fractions of the input.
        // The slots take turns, so that a restarted application has time to open a transaction
        // before it is killed again.
        List<Double> moments = new ArrayList<>();
        for (int i = 0; i < APP_KILLS; i++) {
            moments.add(KILL_FROM + rnd.nextDouble() * (KILL_TO - KILL_FROM));
        }
        Collections.sort(moments);
        List<Kill> plan = new ArrayList<>();
        int firstSlot = rnd.nextInt(APPS);
        for (int i = 0; i < APP_KILLS; i++) {
            plan.add(new Kill(moments.get(i), (firstSlot + i) % APPS));
        }
        plan.add(new Kill(0.3 + rnd.nextDouble() * 0.3, -1));
        plan.sort((x, y) -> Double.compare(x.at(), y.at()));
        note("plan: " + plan);

        Path stop = dir.resolve("stop");
        App[] live = new App[APPS];
        int[] incarnation = new int[APPS];
        for (int s = 0; s < APPS; s++) {
            live[s] = new App(dir, s, ++incarnation[s], b, group, in, out, stop);
            apps.add(live[s]);
        }
        int appKills = 0;
        int midTxnKills = 0;
        int brokerKills = 0;
        int unexpected = 0;
        List<String> unexpectedWhy = new ArrayList<>();
        int next = 0;
        long started = System.nanoTime();
        long doneAt = -1;
        long lastOffsetCheck = 0;
        Map<Integer, Long> groupAt = null;
        try (Admin admin = admin(b)) {
            while (System.nanoTime() - started < TimeUnit.MILLISECONDS.toNanos(DONE_MS)) {
                Thread.sleep(100);
                // Applications that exited by themselves come back (bounded).
                for (int s = 0; s < APPS; s++) {
                    if (!live[s].proc.isAlive()) {
                        unexpected++;
                        unexpectedWhy.add(live[s].name + " exited " + live[s].proc.exitValue() + " after '"
                            + live[s].lastLine() + "'; " + live[s].stderr());
                        if (unexpected > UNEXPECTED_RESTARTS_MAX) {
                            throw new Failure("applications exited by themselves " + unexpected + " times: " + unexpectedWhy);
                        }
                        live[s] = new App(dir, s, ++incarnation[s], b, group, in, out, stop);
                        apps.add(live[s]);
                    }
                }
                long progress = 0;
                for (App a : new ArrayList<>(apps)) {
                    progress += a.committedRecords();
                }
                if (next < plan.size() && progress >= plan.get(next).at() * RECORDS) {
                    Kill k = plan.get(next++);
                    if (k.slot() < 0) {
                        broker.kill();
                        brokerKills++;
                        note(secs(System.nanoTime()) + " broker SIGKILLed at " + progress + " records committed");
                        Thread.sleep(500 + rnd.nextInt(1000));
                        broker.start();
                        note(secs(System.nanoTime()) + " broker restarted, pid " + broker.proc.pid());
                    } else {
                        App a = live[k.slot()];
                        // A random moment while a transaction is open, if one opens soon enough:
                        // while its records are sent, or while it commits.
                        String when = rnd.nextBoolean() ? "begin" : "committing";
                        long waitUntil = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(MID_TXN_WAIT_MS);
                        Thread.sleep(rnd.nextInt(50));
                        while (System.nanoTime() < waitUntil && !a.lastEvent().equals(when)) {
                            Thread.sleep(1);
                        }
                        String last = a.lastEvent();
                        a.kill();
                        appKills++;
                        if (Set.of("begin", "committing").contains(last)) {
                            midTxnKills++;
                        }
                        note(secs(System.nanoTime()) + " " + a.name + " SIGKILLed after '" + last + "' at "
                            + progress + " records committed");
                        live[k.slot()] = new App(dir, k.slot(), ++incarnation[k.slot()], b, group, in, out, stop);
                        apps.add(live[k.slot()]);
                    }
                }
                if (next == plan.size() && System.nanoTime() - lastOffsetCheck > TimeUnit.SECONDS.toNanos(1)) {
                    lastOffsetCheck = System.nanoTime();
                    try {
                        groupAt = groupOffsets(admin, group, in, PARTITIONS);
                    } catch (Exception e) {
                        groupAt = null;
                    }
                    if (inEnds.equals(groupAt)) {
                        doneAt = System.nanoTime();
                        break;
                    }
                }
            }
        }
        for (String u : unexpectedWhy) {
            note("unexpected exit: " + u);
        }
        note(String.format("processing took %.1f s; %d application kills (%d with a transaction open), %d broker kill",
            (System.nanoTime() - started) / 1e9, appKills, midTxnKills, brokerKills));
        checkEquals("exactly-once: every planned kill happened (applications, broker)", APP_KILLS + "," + 1,
            appKills + "," + brokerKills);
        check("exactly-once: at least half the application kills landed while a transaction was open",
            midTxnKills * 2 >= APP_KILLS ? null : midTxnKills + " of " + appKills);
        check("exactly-once: the group's committed offsets reach the input's end offsets within " + DONE_MS / 1000 + " s",
            doneAt > 0 ? null : "offsets " + groupAt + ", end offsets " + inEnds);

        // Stop the applications and let them close.
        Files.writeString(stop, "");
        List<String> unclean = new ArrayList<>();
        for (App a : live) {
            if (!a.proc.waitFor(40, TimeUnit.SECONDS)) {
                unclean.add(a.name + " still running 40 s after the stop file");
            } else if (a.proc.exitValue() != 0 || !a.lastEvent().equals("closed")) {
                unclean.add(a.name + " exited " + a.proc.exitValue() + " after '" + a.lastEvent() + "'; " + a.stderr());
            }
        }
        check("exactly-once: the applications close cleanly", unclean.isEmpty() ? null : unclean.toString());

        // What the applications logged: every transaction of every run, by NAME/TXN.
        Map<String, Txn> txns = new HashMap<>();
        List<String> fatal = new ArrayList<>();
        int onPurpose = 0;
        long onPurposeRecords = 0;
        int abortedByError = 0;
        for (App a : new ArrayList<>(apps)) {
            for (String[] e : a.events()) {
                String ev = e[1];
                if (ev.equals("begin")) {
                    txns.computeIfAbsent(a.name + "/" + e[2], x -> new Txn()).count = Long.parseLong(e[3]);
                } else if (ev.equals("committed")) {
                    txns.get(a.name + "/" + e[2]).end = "committed";
                } else if (ev.equals("aborting")) {
                    Txn t = txns.get(a.name + "/" + e[2]);
                    t.end = "aborting";
                    if (e[4].equals("on-purpose")) {
                        t.error = "on-purpose";
                        onPurpose++;
                        onPurposeRecords += t.count;
                    } else {
                        abortedByError++;
                        String error = String.join(" ", Arrays.copyOfRange(e, 5, e.length));
                        t.error = error.length() <= 160 ? error : error.substring(0, 160) + "...";
                    }
                } else if (ev.equals("aborted")) {
                    txns.get(a.name + "/" + e[2]).end = "aborted";
                } else if (ev.equals("fatal")) {
                    fatal.add(a.name + ": " + String.join(" ", Arrays.copyOfRange(e, 2, e.length)));
                }
            }
        }
        note("transactions logged: " + txns.size() + ", aborted on purpose " + onPurpose + " (" + onPurposeRecords
            + " records), aborted after an error " + abortedByError);
        for (var e : txns.entrySet()) {
            if (!e.getValue().error.isEmpty() && !e.getValue().error.equals("on-purpose")) {
                note("  " + e.getKey() + " aborted after " + e.getValue().error);
            }
        }
        check("exactly-once: no application failed fatally (fenced, out of order, unexpected exit)",
            fatal.isEmpty() && unexpected == 0 ? null : "fatal: " + fatal + "; unexpected exits: " + unexpectedWhy);
        check("exactly-once: some transactions were aborted on purpose, after their records were flushed",
            onPurpose > 0 ? null : "none in the logs");

        // The output, as read_committed and read_uncommitted consumers see it.
        Map<Integer, Long> outEnds;
        try (Admin admin = admin(b)) {
            outEnds = logEndOffsets(admin, out, PARTITIONS);
        }
        note("output log end offsets " + outEnds);
        List<ConsumerRecord<String, String>> committed = readAll(b, out, "read_committed", outEnds);
        List<ConsumerRecord<String, String>> uncommitted = readAll(b, out, "read_uncommitted", outEnds);
        note("read_committed: " + committed.size() + " records, read_uncommitted: " + uncommitted.size());

        // read_committed: every input's output once, with its input's partition and offset.
        int[] seen = new int[RECORDS];
        List<String> malformed = new ArrayList<>();
        List<String> wrongSource = new ArrayList<>();
        Map<String, Long> visibleByTxn = new HashMap<>();
        Set<String> committedValues = new HashSet<>();
        for (ConsumerRecord<String, String> r : committed) {
            String[] f = r.value() == null ? new String[0] : r.value().split("\\|");
            long id = f.length == 6 && f[0].equals("out") ? parseLong(f[1]) : -1;
            if (id < 0 || id >= RECORDS) {
                malformed.add(r.partition() + "@" + r.offset() + "=" + r.value());
                continue;
            }
            seen[(int) id]++;
            committedValues.add(r.value());
            if (parseLong(f[2]) != partition[(int) id] || parseLong(f[3]) != offset[(int) id]
                || !Objects.equals(r.key(), "k" + (id % 1009))) {
                wrongSource.add(r.key() + "=" + r.value() + " (input " + id + " is at " + partition[(int) id] + "@" + offset[(int) id] + ")");
            }
            visibleByTxn.merge(f[4] + "/" + f[5], 1L, Long::sum);
        }
        List<Integer> missing = new ArrayList<>();
        List<String> twice = new ArrayList<>();
        for (int i = 0; i < RECORDS; i++) {
            if (seen[i] == 0) {
                missing.add(i);
            } else if (seen[i] > 1) {
                twice.add(i + "x" + seen[i]);
            }
        }
        check("exactly-once: read_committed sees every input record's output",
            missing.isEmpty() ? null : missing.size() + " missing, first " + missing.subList(0, Math.min(10, missing.size())));
        check("exactly-once: read_committed sees each output once",
            twice.isEmpty() ? null : twice.size() + " more than once, first " + twice.subList(0, Math.min(10, twice.size())));
        check("exactly-once: read_committed sees nothing else",
            malformed.isEmpty() ? null : malformed.size() + " other records: " + malformed.subList(0, Math.min(5, malformed.size())));
        check("exactly-once: each output carries its input's key, partition and offset",
            wrongSource.isEmpty() ? null : wrongSource.size() + " do not: " + wrongSource.subList(0, Math.min(5, wrongSource.size())));

        // Transactions: aborted ones invisible, committed ones entirely visible.
        List<String> visibleAborted = new ArrayList<>();
        List<String> unknownTxn = new ArrayList<>();
        List<String> partlyCommitted = new ArrayList<>();
        for (var e : visibleByTxn.entrySet()) {
            Txn t = txns.get(e.getKey());
            if (t == null) {
                unknownTxn.add(e.getKey());
            } else if (!t.end.equals("committed") && !t.end.equals("open")) {
                visibleAborted.add(e.getKey() + " (" + t.end + " " + t.error + ", " + e.getValue() + " records)");
            } else if (e.getValue() != t.count) {
                // A transaction is visible entirely or not at all.
                partlyCommitted.add(e.getKey() + " (" + t.end + ": " + e.getValue() + " of " + t.count + " records)");
            }
        }
        for (var e : txns.entrySet()) {
            if (e.getValue().end.equals("committed") && !visibleByTxn.containsKey(e.getKey())) {
                partlyCommitted.add(e.getKey() + " (committed: none of " + e.getValue().count + " records)");
            }
        }
        check("exactly-once: read_committed sees nothing from an aborted transaction",
            visibleAborted.isEmpty() && unknownTxn.isEmpty() ? null
                : "aborted: " + visibleAborted.subList(0, Math.min(5, visibleAborted.size())) + "; never begun: " + unknownTxn);
        check("exactly-once: read_committed sees every transaction entirely or not at all, and every committed one",
            partlyCommitted.isEmpty() ? null : partlyCommitted.size() + ": " + partlyCommitted.subList(0, Math.min(5, partlyCommitted.size())));

        // read_uncommitted: the committed records plus those of aborted (or cut-short) transactions.
        Map<String, Long> extraByTxn = new HashMap<>();
        List<String> extraBad = new ArrayList<>();
        Map<String, Integer> uncommittedCount = new HashMap<>();
        for (ConsumerRecord<String, String> r : uncommitted) {
            uncommittedCount.merge(r.value(), 1, Integer::sum);
        }
        List<String> notInUncommitted = new ArrayList<>();
        for (String v : committedValues) {
            if (!uncommittedCount.containsKey(v)) {
                notInUncommitted.add(v);
            }
        }
        long extras = 0;
        for (ConsumerRecord<String, String> r : uncommitted) {
            if (committedValues.contains(r.value())) {
                continue;
            }
            extras++;
            String[] f = r.value() == null ? new String[0] : r.value().split("\\|");
            String tag = f.length == 6 ? f[4] + "/" + f[5] : "?";
            Txn t = txns.get(tag);
            if (t == null || t.end.equals("committed")) {
                extraBad.add(r.partition() + "@" + r.offset() + "=" + r.value() + " (" + (t == null ? "no such transaction" : t.end) + ")");
            } else {
                extraByTxn.merge(tag, 1L, Long::sum);
            }
        }
        check("exactly-once: read_uncommitted sees every record read_committed sees, and more",
            notInUncommitted.isEmpty() && uncommitted.size() > committed.size() ? null
                : notInUncommitted.size() + " committed records missing; " + uncommitted.size() + " vs " + committed.size());
        check("exactly-once: the records only read_uncommitted sees are all from aborted or unfinished transactions",
            extraBad.isEmpty() ? null : extraBad.size() + ": " + extraBad.subList(0, Math.min(5, extraBad.size())));
        long onPurposeSeen = 0;
        List<String> onPurposeShort = new ArrayList<>();
        for (var e : txns.entrySet()) {
            if (e.getValue().error.equals("on-purpose")) {
                long n = extraByTxn.getOrDefault(e.getKey(), 0L);
                onPurposeSeen += n;
                if (n != e.getValue().count) {
                    onPurposeShort.add(e.getKey() + ": " + n + " of " + e.getValue().count);
                }
            }
        }
        note("read_uncommitted only: " + extras + " records, " + onPurposeSeen + " of them from transactions aborted on purpose");
        check("exactly-once: read_uncommitted sees every record of the transactions aborted on purpose",
            onPurposeShort.isEmpty() && onPurposeSeen > 0 ? null
                : "seen " + onPurposeSeen + "; short: " + onPurposeShort.subList(0, Math.min(5, onPurposeShort.size())));
    }

    static long parseLong(String s) {
        try {
            return Long.parseLong(s);
        } catch (NumberFormatException e) {
            return -1;
        }
    }
}
