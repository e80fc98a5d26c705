package sluice;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.function.Predicate;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListGroupsOptions;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsSpec;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.admin.ShareMemberDescription;
import org.apache.kafka.clients.admin.SharePartitionOffsetInfo;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.GroupIdNotFoundException;
import org.apache.kafka.common.errors.GroupNotEmptyException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Share groups (KIP-932, "queues for Kafka") with Apache Kafka's {@link KafkaShareConsumer} and
 * Admin client against a running broker: Sluice, or Apache Kafka 4.4 as the reference.
 *
 * <p>Each scenario has a topic and share group of its own (names unique per run). It creates the
 * topic with Admin and, before any consumer joins, sets group configs with
 * {@code incrementalAlterConfigs} on the GROUP resource: {@code share.auto.offset.reset=earliest}
 * (Kafka's default is latest), {@code share.assignment.interval.ms=0} (so that a member is
 * assigned at once, not at its second heartbeat 5 s later), and what the scenario needs. Record
 * values name the records ({@code r-N}); every delivery is kept (consumer, offset, value,
 * deliveryCount) and the checks assert on those and on the offsets the producer was given:
 * <ol>
 * <li>four consumers share one partition; each record is delivered exactly once, with implicit
 * acknowledgement;
 * <li>explicit acknowledgement: RELEASE redelivers with delivery count 2, REJECT never redelivers;
 * <li>a record always released is delivered {@code share.delivery.count.limit} times (a group
 * config) and then archived, without holding up the records after it;
 * <li>records a live consumer holds go to another one when the acquisition lock (the group's
 * {@code share.record.lock.duration.ms}) expires; records held by a member JVM ({@link ShareMember})
 * killed with SIGKILL come back as soon as its connection closes, long before their lock expires;
 * <li>{@code share.isolation.level} read_committed delivers only committed transactional records,
 * read_uncommitted aborted ones too;
 * <li>Admin: listGroups, describeShareGroups, deleteShareGroups (refused while members are in the
 * group), listShareGroupOffsets (lag 0 once everything is acknowledged) and alterShareGroupOffsets.
 * </ol>
 *
 * <p>The broker must run with {@code group.share.record.lock.duration.ms=2000} and
 * {@code group.share.min.record.lock.duration.ms} at most that (Kafka's defaults are 30 s and
 * 15 s), so that lock expiry takes 2 s and groups may set 3 s.
 *
 * <p>Usage: {@code sluice.ShareTest BOOTSTRAP WORK_DIR}. Every check prints {@code PASS name} or
 * {@code FAIL name: why}; the last line is {@code share: N passed, N failed}, and the exit status
 * is non-zero when anything failed. Member JVMs log to WORK_DIR/SCENARIO/ and are killed by PID
 * when their scenario ends, also on failure or SIGTERM. {@code JAVA_SHARE_ONLY=REGEX} runs only
 * the scenarios whose slug matches (parallel, explicit, poison, lock-alive, lock-killed, isolation,
 * admin).
 */
public final class ShareTest {
    /** The broker's group.share.record.lock.duration.ms. */
    static final long LOCK_MS = 2_000;
    /** The group's share.record.lock.duration.ms in the lock-timeout scenario with a live holder. */
    static final long GROUP_LOCK_MS = 3_000;
    /**
     * The group's share.record.lock.duration.ms in the SIGKILL scenario: long, so that records
     * coming back well before it shows that the broker released them when the connection closed.
     */
    static final long KILLED_LOCK_MS = 15_000;
    /** The delivery limit the poison scenario sets (Kafka's default is 5, its range 2..10). */
    static final int DELIVERY_LIMIT = 4;

    /** Bounds for a stuck broker or client; a passing run takes a fraction of these. */
    static final long JOIN_MS = 30_000;
    static final long DRAIN_MS = 30_000;
    static final long DRIVER_DEADLINE_MS = 115_000;

    static final long T0 = System.nanoTime();

    private final String bootstrap;
    private final Path work;
    /** Unique per run, so that reruns against one broker never meet an old topic or group. */
    private final String run = Long.toString(System.currentTimeMillis() % 10_000_000_000L, 36);
    private final List<Process> spawned = Collections.synchronizedList(new ArrayList<>());
    private int passed;
    private int failed;

    private ShareTest(String bootstrap, Path work) {
        this.bootstrap = bootstrap;
        this.work = work;
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: sluice.ShareTest BOOTSTRAP WORK_DIR");
            System.exit(2);
        }
        ShareTest t = new ShareTest(args[0], Path.of(args[1]));
        Files.createDirectories(t.work);
        Runtime.getRuntime().addShutdownHook(new Thread(t::killEverything, "kill-spawned"));
        Thread deadline = new Thread(() -> {
            try {
                Thread.sleep(DRIVER_DEADLINE_MS);
            } catch (InterruptedException e) {
                return;
            }
            synchronized (System.out) {
                System.out.println("FAIL share: finished within " + DRIVER_DEADLINE_MS / 1000 + " s: still running; stopping");
                System.out.println("share: " + t.passed + " passed, " + (t.failed + 1) + " failed");
                System.out.flush();
            }
            Runtime.getRuntime().exit(1);
        }, "deadline");
        deadline.setDaemon(true);
        deadline.start();
        t.runAll();
        System.out.printf("share: %d passed, %d failed%n", t.passed, t.failed);
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

    private void runAll() {
        System.out.println("share: run " + run + " against " + bootstrap);
        scenario("share 4 consumers on 1 partition", "parallel", this::parallel);
        scenario("share explicit acknowledgement", "explicit", this::explicit);
        scenario("share delivery limit", "poison", this::poison);
        scenario("share lock timeout, holder alive", "lock-alive", this::lockAlive);
        scenario("share lock timeout, holder SIGKILLed", "lock-killed", this::lockKilled);
        scenario("share RENEW keeps records acquired", "renew", this::renew);
        scenario("share isolation levels", "isolation", this::isolation);
        scenario("share admin", "admin", this::admin);
    }

    // ---------------------------------------------------------------- checks and scenarios

    /** A failed step: the scenario stops here with this reason. */
    static final class Failure extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Failure(String why) {
            super(why);
        }
    }

    /** The checks of one scenario, printed together when it ends. */
    final class Scenario {
        final String title;
        final String slug;
        final Path dir;
        final List<String> lines = new ArrayList<>();
        final List<Reader> readers = new ArrayList<>();
        final List<Process> procs = new ArrayList<>();
        int ok;
        int bad;

        Scenario(String title, String slug) throws IOException {
            this.title = title;
            this.slug = slug;
            this.dir = work.resolve(slug);
            Files.createDirectories(dir);
        }

        /** A topic or group name unique to this scenario and run. */
        String name(String what) {
            return "share-" + slug + "-" + what + "-" + run;
        }

        void pass(String name) {
            ok++;
            lines.add("PASS " + title + ": " + name);
        }

        void fail(String name, String why) {
            bad++;
            lines.add("FAIL " + title + ": " + name + ": " + why);
        }

        /** A check that passes when {@code why} is null. */
        boolean check(String name, String why) {
            if (why == null) {
                pass(name);
            } else {
                fail(name, why);
            }
            return why == null;
        }

        boolean checkEquals(String name, Object expected, Object actual) {
            return check(name, Objects.equals(expected, actual) ? null
                : "expected <" + abbreviate(String.valueOf(expected)) + "> but got <" + abbreviate(String.valueOf(actual)) + ">");
        }

        void note(String line) {
            lines.add("  " + title + ": " + line);
        }

        Reader reader(String name, String group, String topic, Map<String, String> config, Decider decider) {
            Reader r = new Reader(name, group, topic, config, decider);
            readers.add(r);
            return r;
        }
    }

    interface Body {
        void run(Scenario s) throws Exception;
    }

    private void scenario(String title, String slug, Body body) {
        String only = System.getenv("JAVA_SHARE_ONLY");
        if (only != null && !only.isEmpty() && !slug.matches(only)) {
            return;
        }
        long start = System.nanoTime();
        Scenario s;
        try {
            s = new Scenario(title, slug);
        } catch (IOException e) {
            report(List.of("FAIL " + title + ": cannot create its directory: " + e), 0, 1);
            return;
        }
        try {
            body.run(s);
        } catch (Failure e) {
            s.fail("ran to the end", e.getMessage());
        } catch (Throwable e) {
            Throwable c = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
            StringBuilder where = new StringBuilder();
            for (StackTraceElement el : c.getStackTrace()) {
                if (el.getClassName().startsWith("sluice.")) {
                    where.append(" at ").append(el.getMethodName()).append(':').append(el.getLineNumber());
                    break;
                }
            }
            s.fail("ran to the end", "threw " + c + where);
        } finally {
            for (Reader r : s.readers) {
                r.stopAndClose();
            }
            for (Process p : s.procs) {
                kill(p);
            }
        }
        s.lines.add(String.format("  %s: took %.1f s", title, (System.nanoTime() - start) / 1e9));
        report(s.lines, s.ok, s.bad);
    }

    private void report(List<String> lines, int ok, int bad) {
        synchronized (System.out) {
            for (String l : lines) {
                System.out.println(l);
            }
            System.out.flush();
            passed += ok;
            failed += bad;
        }
    }

    static void waitUntil(String what, BooleanSupplier done, long timeoutMs) throws InterruptedException {
        long end = System.nanoTime() + timeoutMs * 1_000_000;
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > end) {
                throw new Failure("waited " + timeoutMs / 1000.0 + " s for " + what);
            }
            Thread.sleep(50);
        }
    }

    static String abbreviate(String s) {
        s = s.replace('\n', '|');
        return s.length() <= 400 ? s : s.substring(0, 400) + "...";
    }

    static String secs(long nanos) {
        return String.format("%.3fs", (nanos - T0) / 1e9);
    }

    static String value(int n) {
        return "r-" + n;
    }

    // ---------------------------------------------------------------- admin, producing

    Admin admin() {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        return Admin.create(p);
    }

    static void createTopic(Admin admin, String topic, int partitions) throws Exception {
        admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get(20, TimeUnit.SECONDS);
    }

    /**
     * Sets group configs before anyone joins: share.auto.offset.reset=earliest, and
     * share.assignment.interval.ms=0 (KIP-1263; Kafka's default, 1000 ms, has a new member wait for
     * its assignment until its second heartbeat, 5 s later), then {@code more}.
     */
    static void groupConfig(Admin admin, String group, Map<String, String> more) throws Exception {
        Map<String, String> all = new LinkedHashMap<>();
        all.put("share.auto.offset.reset", "earliest");
        all.put("share.assignment.interval.ms", "0");
        all.putAll(more);
        List<AlterConfigOp> ops = new ArrayList<>();
        all.forEach((k, v) -> ops.add(new AlterConfigOp(new ConfigEntry(k, v), AlterConfigOp.OpType.SET)));
        admin.incrementalAlterConfigs(Map.of(new ConfigResource(ConfigResource.Type.GROUP, group), ops))
            .all().get(20, TimeUnit.SECONDS);
    }

    /** The group's configs as describeConfigs on the GROUP resource shows them. */
    static Map<String, String> describeGroupConfig(Admin admin, String group) throws Exception {
        ConfigResource res = new ConfigResource(ConfigResource.Type.GROUP, group);
        Config c = admin.describeConfigs(List.of(res)).all().get(20, TimeUnit.SECONDS).get(res);
        Map<String, String> m = new TreeMap<>();
        for (ConfigEntry e : c.entries()) {
            m.put(e.name(), e.value());
        }
        return m;
    }

    /**
     * Produces values {@code values} in order to partition 0 (acks=all, idempotent), in producer
     * batches of at most about {@code batchBytes}; the offset each was written at.
     */
    Map<String, Long> produce(String topic, List<String> values, int batchBytes) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, String.valueOf(batchBytes));
        Map<String, Long> at = new HashMap<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (String v : values) {
                sent.add(producer.send(new ProducerRecord<>(topic, 0, null, v)));
            }
            producer.flush();
            for (int i = 0; i < values.size(); i++) {
                at.put(values.get(i), sent.get(i).get(20, TimeUnit.SECONDS).offset());
            }
        }
        return at;
    }

    static List<String> values(int from, int count) {
        List<String> l = new ArrayList<>();
        for (int i = from; i < from + count; i++) {
            l.add(value(i));
        }
        return l;
    }

    static long endOffset(Admin admin, TopicPartition tp) throws Exception {
        return admin.listOffsets(Map.of(tp, OffsetSpec.latest())).partitionResult(tp).get(20, TimeUnit.SECONDS).offset();
    }

    /** The share group's start offset and lag for the partition; null when it has none. */
    static SharePartitionOffsetInfo shareOffset(Admin admin, String group, TopicPartition tp) throws Exception {
        Map<TopicPartition, SharePartitionOffsetInfo> m = admin.listShareGroupOffsets(
                Map.of(group, new ListShareGroupOffsetsSpec().topicPartitions(List.of(tp))))
            .partitionsToOffsetInfo(group).get(20, TimeUnit.SECONDS);
        return m.get(tp);
    }

    static ShareGroupDescription describe(Admin admin, String group) throws Exception {
        return admin.describeShareGroups(List.of(group)).describedGroups().get(group).get(20, TimeUnit.SECONDS);
    }

    /**
     * Polls until listShareGroupOffsets reports lag 0 for the partition, with a start offset
     * within [0, end]: everything before the log end offset {@code end} acknowledged or archived.
     * Null then, else why not. (Kafka 4.4 persists the start offset a write behind: after the
     * last acknowledgement it can still show an older start offset, with lag 0.)
     */
    static String lagReachesZero(Admin admin, String group, TopicPartition tp, long end) throws Exception {
        long deadline = System.nanoTime() + 15_000_000_000L;
        SharePartitionOffsetInfo info = null;
        while (System.nanoTime() < deadline) {
            info = shareOffset(admin, group, tp);
            if (info != null && info.lag().equals(Optional.of(0L)) && info.startOffset() >= 0 && info.startOffset() <= end) {
                return null;
            }
            Thread.sleep(200);
        }
        return "for 15 s listShareGroupOffsets said " + info + " (log end offset " + end + ")";
    }

    // ---------------------------------------------------------------- share consumers

    /** One delivery of a record to a consumer. */
    record Got(String consumer, long t, int partition, long offset, String value, int deliveryCount) {
        @Override
        public String toString() {
            return consumer + "@" + secs(t) + " " + partition + ":" + offset + " " + value + " dc=" + deliveryCount;
        }
    }

    /** What an explicit-mode consumer does with a record; null for implicit acknowledgement. */
    interface Decider {
        AcknowledgeType decide(ConsumerRecord<String, String> r);
    }

    /**
     * A share consumer polling in a thread of its own (the consumer is only used from it). It
     * keeps every delivery; in explicit mode it acknowledges each record as its {@link Decider}
     * says and commits (commitSync) after each batch, keeping any acknowledgement error. With
     * {@code holdAfterFirst} it stops polling after the first batch, holding those records
     * unacknowledged until it is closed.
     */
    final class Reader extends Thread {
        final String name;
        final String group;
        final String topic;
        final Properties config = new Properties();
        final Decider decider;
        volatile boolean holdAfterFirst;
        volatile long processMs;
        volatile boolean stop;
        final List<Got> got = Collections.synchronizedList(new ArrayList<>());
        final List<String> ackErrors = Collections.synchronizedList(new ArrayList<>());
        volatile Throwable crash;
        volatile String closeError;
        volatile int lockTimeoutMs = -1;
        volatile long firstBatchAt;

        Reader(String name, String group, String topic, Map<String, String> extra, Decider decider) {
            super("reader-" + name);
            setDaemon(true);
            this.name = name;
            this.group = group;
            this.topic = topic;
            this.decider = decider;
            config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            config.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            config.put(ConsumerConfig.CLIENT_ID_CONFIG, name + "-" + run);
            config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            if (decider != null) {
                config.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, "explicit");
            }
            config.putAll(extra);
        }

        @Override
        public void run() {
            KafkaShareConsumer<String, String> c;
            try {
                c = new KafkaShareConsumer<>(config);
            } catch (Throwable e) {
                crash = e;
                return;
            }
            try {
                c.subscribe(List.of(topic));
                while (!stop) {
                    ConsumerRecords<String, String> records = c.poll(Duration.ofMillis(100));
                    if (records.isEmpty()) {
                        continue;
                    }
                    long now = System.nanoTime();
                    for (ConsumerRecord<String, String> r : records) {
                        got.add(new Got(name, now, r.partition(), r.offset(), r.value(),
                            r.deliveryCount().map(Short::intValue).orElse(-1)));
                    }
                    if (firstBatchAt == 0) {
                        firstBatchAt = now;
                        lockTimeoutMs = c.acquisitionLockTimeoutMs().orElse(-1);
                    }
                    if (decider != null) {
                        for (ConsumerRecord<String, String> r : records) {
                            c.acknowledge(r, decider.decide(r));
                        }
                        Map<TopicIdPartition, Optional<KafkaException>> res = c.commitSync(Duration.ofSeconds(10));
                        res.forEach((tp, e) -> e.ifPresent(x -> ackErrors.add(tp + ": " + x)));
                    }
                    if (holdAfterFirst) {
                        while (!stop) {
                            Thread.sleep(20);
                        }
                        break;
                    }
                    if (processMs > 0) {
                        Thread.sleep(processMs);
                    }
                }
            } catch (Throwable e) {
                crash = e;
            } finally {
                try {
                    c.close(Duration.ofSeconds(10));
                } catch (Throwable e) {
                    closeError = e.toString();
                }
            }
        }

        List<Got> got() {
            synchronized (got) {
                return new ArrayList<>(got);
            }
        }

        void stopAndClose() {
            stop = true;
            try {
                join(20_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }

        void checkAlive() {
            if (crash != null) {
                throw new Failure("consumer " + name + " failed: " + crash);
            }
        }
    }

    static List<Got> all(Collection<Reader> readers) {
        List<Got> l = new ArrayList<>();
        for (Reader r : readers) {
            l.addAll(r.got());
        }
        return l;
    }

    static Set<String> distinct(List<Got> got) {
        Set<String> s = new HashSet<>();
        for (Got g : got) {
            s.add(g.value());
        }
        return s;
    }

    static Map<String, List<Got>> byValue(List<Got> got) {
        Map<String, List<Got>> m = new TreeMap<>();
        for (Got g : got) {
            m.computeIfAbsent(g.value(), k -> new ArrayList<>()).add(g);
        }
        return m;
    }

    /** Every delivery's offset is the one its value was produced at; null, or the first that is not. */
    static String offsetsMatch(List<Got> got, Map<String, Long> at) {
        for (Got g : got) {
            Long o = at.get(g.value());
            if (o == null || o != g.offset() || g.partition() != 0) {
                return "delivered " + g + ", produced at " + (o == null ? "nowhere" : "0:" + o);
            }
        }
        return null;
    }

    /** Null when each of {@code values} was delivered exactly once with delivery count 1. */
    static String exactlyOnceFirstTime(List<Got> got, Collection<String> values) {
        Map<String, List<Got>> by = byValue(got);
        List<String> missing = new ArrayList<>();
        List<String> wrong = new ArrayList<>();
        for (String v : values) {
            List<Got> l = by.getOrDefault(v, List.of());
            if (l.isEmpty()) {
                missing.add(v);
            } else if (l.size() > 1 || l.get(0).deliveryCount() != 1) {
                wrong.add(l.toString());
            }
        }
        if (missing.isEmpty() && wrong.isEmpty()) {
            return null;
        }
        return missing.size() + " never delivered " + abbreviate(missing.toString()) + "; " + wrong.size()
            + " delivered more than once or with delivery count != 1: " + abbreviate(wrong.toString());
    }

    /** Records delivered whose value is not in {@code values}. */
    static List<Got> others(List<Got> got, Collection<String> values) {
        Set<String> want = new HashSet<>(values);
        List<Got> l = new ArrayList<>();
        for (Got g : got) {
            if (!want.contains(g.value())) {
                l.add(g);
            }
        }
        return l;
    }

    /** Waits until {@code done} holds for what the readers got, failing early on a crashed reader. */
    static void drain(String what, Collection<Reader> readers, Predicate<List<Got>> done, long timeoutMs) throws InterruptedException {
        waitUntil(what, () -> {
            for (Reader r : readers) {
                r.checkAlive();
            }
            return done.test(all(readers));
        }, timeoutMs);
    }

    /** Keeps the readers polling for {@code ms} more, to see what else arrives. */
    static void quiet(Collection<Reader> readers, long ms) throws InterruptedException {
        Thread.sleep(ms);
        for (Reader r : readers) {
            r.checkAlive();
        }
    }

    static String closedCleanly(Collection<Reader> readers) {
        for (Reader r : readers) {
            r.stopAndClose();
            if (r.isAlive()) {
                return r.name + " did not close within 20 s";
            }
            if (r.crash != null) {
                return r.name + " failed: " + r.crash;
            }
            if (r.closeError != null) {
                return r.name + " close threw " + r.closeError;
            }
        }
        return null;
    }

    /** Waits until the group has {@code n} members, each assigned exactly {@code tps}. */
    static ShareGroupDescription waitAssigned(Admin admin, String group, int n, Set<TopicPartition> tps,
                                              Collection<Reader> readers) throws Exception {
        long end = System.nanoTime() + JOIN_MS * 1_000_000;
        ShareGroupDescription d = null;
        while (System.nanoTime() < end) {
            for (Reader r : readers) {
                r.checkAlive();
            }
            try {
                d = describe(admin, group);
            } catch (ExecutionException e) {
                if (!(e.getCause() instanceof GroupIdNotFoundException)) {
                    throw e;
                }
            }
            if (d != null && d.members().size() == n
                && d.members().stream().allMatch(m -> m.assignment().topicPartitions().equals(tps))) {
                return d;
            }
            Thread.sleep(100);
        }
        throw new Failure("waited " + JOIN_MS / 1000 + " s for " + n + " members each assigned " + tps + "; last described " + d);
    }

    // ---------------------------------------------------------------- 1: parallelism beyond partitions

    private void parallel(Scenario s) throws Exception {
        String topic = s.name("t");
        String group = s.name("g");
        TopicPartition tp = new TopicPartition(topic, 0);
        int n = 3_000;
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
            groupConfig(admin, group, Map.of());
            List<Reader> rs = new ArrayList<>();
            for (int i = 0; i < 4; i++) {
                Reader r = s.reader("c" + i, group, topic, Map.of(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "100"), null);
                // A little work per batch, so that one consumer does not take everything.
                r.processMs = 5;
                rs.add(r);
                r.start();
            }
            waitAssigned(admin, group, 4, Set.of(tp), rs);
            // About 80 records per producer batch: Kafka acquires whole batches, one or two a fetch.
            Map<String, Long> at = produce(topic, values(0, n), 1024);
            drain("all " + n + " records", rs, g -> distinct(g).size() >= n, DRAIN_MS);
            s.check("every consumer closes cleanly (acknowledging its last batch)", closedCleanly(rs));
            List<Got> got = all(rs);
            s.check("all " + n + " records, each delivered once, delivery count 1", exactlyOnceFirstTime(got, at.keySet()));
            s.checkEquals("deliveries", n, got.size());
            s.check("each delivery at the offset its value was produced at", offsetsMatch(got, at));
            Map<String, Integer> per = new TreeMap<>();
            for (Reader r : rs) {
                per.put(r.name, r.got().size());
            }
            long busy = per.values().stream().filter(c -> c > 0).count();
            s.check("at least 2 of the 4 consumers received records", busy >= 2 ? null : "records per consumer: " + per);
            s.note("records per consumer: " + per);
            s.check("listShareGroupOffsets: lag 0", lagReachesZero(admin, group, tp, endOffset(admin, tp)));
        }
    }

    // ---------------------------------------------------------------- 2: explicit RELEASE and REJECT

    private void explicit(Scenario s) throws Exception {
        String topic = s.name("t");
        String group = s.name("g");
        TopicPartition tp = new TopicPartition(topic, 0);
        int n = 100;
        Set<String> released = new HashSet<>();
        Set<String> rejected = new HashSet<>();
        Set<String> plain = new HashSet<>();
        for (int i = 0; i < n; i++) {
            (i % 10 == 3 ? released : i % 10 == 7 ? rejected : plain).add(value(i));
        }
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
            groupConfig(admin, group, Map.of());
            Map<String, Long> at = produce(topic, values(0, n), 16_384);
            Set<String> seen = new HashSet<>();
            Reader r = s.reader("c", group, topic, Map.of(), rec -> {
                String v = rec.value();
                if (rejected.contains(v)) {
                    return AcknowledgeType.REJECT;
                }
                if (released.contains(v) && seen.add(v)) {
                    return AcknowledgeType.RELEASE;
                }
                return AcknowledgeType.ACCEPT;
            });
            r.start();
            drain("the released records to come back", List.of(r), g -> {
                Map<String, List<Got>> by = byValue(g);
                return by.keySet().containsAll(plain) && released.stream().allMatch(v -> by.getOrDefault(v, List.of()).size() >= 2);
            }, DRAIN_MS);
            // Anything that would still come back (a rejected record, a third delivery) does
            // within a lock duration.
            quiet(List.of(r), LOCK_MS + 1_000);
            s.check("the consumer closes cleanly", closedCleanly(List.of(r)));
            s.checkEquals("acquisitionLockTimeoutMs() is the broker's group.share.record.lock.duration.ms", (int) LOCK_MS, r.lockTimeoutMs);
            List<Got> got = r.got();
            Map<String, List<Got>> by = byValue(got);
            s.check("each delivery at the offset its value was produced at", offsetsMatch(got, at));
            s.check("accepted records: each delivered once, delivery count 1", exactlyOnceFirstTime(got, plain));
            s.check("rejected records: delivered once, delivery count 1, never again", exactlyOnceFirstTime(got, rejected));
            String why = null;
            for (String v : sorted(released)) {
                List<Got> l = by.getOrDefault(v, List.of());
                List<Integer> dcs = l.stream().map(Got::deliveryCount).toList();
                if (!dcs.equals(List.of(1, 2))) {
                    why = v + " delivered with delivery counts " + dcs + ", expected [1, 2]";
                    break;
                }
            }
            s.check("released records: delivered again with delivery count 2, then accepted", why);
            s.checkEquals("deliveries (80 accepted, 10 rejected, 10 released twice)", n + released.size(), got.size());
            s.check("commitSync reported no acknowledgement error", r.ackErrors.isEmpty() ? null : abbreviate(r.ackErrors.toString()));
            s.check("listShareGroupOffsets: lag 0", lagReachesZero(admin, group, tp, endOffset(admin, tp)));
        }
    }

    static List<String> sorted(Collection<String> values) {
        List<String> l = new ArrayList<>(values);
        l.sort((a, b) -> Integer.compare(Integer.parseInt(a.substring(2)), Integer.parseInt(b.substring(2))));
        return l;
    }

    // ---------------------------------------------------------------- 3: delivery limit

    private void poison(Scenario s) throws Exception {
        String topic = s.name("t");
        String group = s.name("g");
        TopicPartition tp = new TopicPartition(topic, 0);
        int n = 20;
        String poison = value(5);
        List<String> rest = values(0, n);
        rest.remove(poison);
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
            groupConfig(admin, group, Map.of("share.delivery.count.limit", String.valueOf(DELIVERY_LIMIT)));
            Map<String, String> cfg = describeGroupConfig(admin, group);
            s.checkEquals("describeConfigs on the group: share.delivery.count.limit", String.valueOf(DELIVERY_LIMIT),
                cfg.get("share.delivery.count.limit"));
            s.checkEquals("describeConfigs on the group: share.auto.offset.reset", "earliest", cfg.get("share.auto.offset.reset"));
            Map<String, Long> at = produce(topic, values(0, n), 16_384);
            Reader r = s.reader("c", group, topic, Map.of(),
                rec -> rec.value().equals(poison) ? AcknowledgeType.RELEASE : AcknowledgeType.ACCEPT);
            r.start();
            drain("the poison record to be delivered " + DELIVERY_LIMIT + " times and the rest once", List.of(r), g -> {
                Map<String, List<Got>> by = byValue(g);
                return by.keySet().containsAll(rest) && by.getOrDefault(poison, List.of()).size() >= DELIVERY_LIMIT;
            }, DRAIN_MS);
            quiet(List.of(r), LOCK_MS + 1_000);
            s.check("the consumer closes cleanly", closedCleanly(List.of(r)));
            List<Got> got = r.got();
            s.check("each delivery at the offset its value was produced at", offsetsMatch(got, at));
            List<Integer> dcs = byValue(got).getOrDefault(poison, List.of()).stream().map(Got::deliveryCount).toList();
            List<Integer> want = new ArrayList<>();
            for (int i = 1; i <= DELIVERY_LIMIT; i++) {
                want.add(i);
            }
            s.checkEquals("the released record: delivered " + DELIVERY_LIMIT + " times (delivery counts 1.." + DELIVERY_LIMIT
                + "), then never again", want, dcs);
            s.check("the other " + rest.size() + " records: each delivered once, delivery count 1", exactlyOnceFirstTime(got, rest));
            s.check("commitSync reported no acknowledgement error", r.ackErrors.isEmpty() ? null : abbreviate(r.ackErrors.toString()));
            s.check("listShareGroupOffsets: lag 0 (the archived record counts as done)",
                lagReachesZero(admin, group, tp, endOffset(admin, tp)));
        }
    }

    // ---------------------------------------------------------------- 4: acquisition lock timeout

    /**
     * Consumer A takes a batch and holds it, alive and connected; B gets it once the lock expires.
     * The group sets its own lock duration (share.record.lock.duration.ms), overriding the broker's.
     */
    private void lockAlive(Scenario s) throws Exception {
        String topic = s.name("t");
        String group = s.name("g");
        TopicPartition tp = new TopicPartition(topic, 0);
        int n = 50;
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
            groupConfig(admin, group, Map.of("share.record.lock.duration.ms", String.valueOf(GROUP_LOCK_MS)));
            Map<String, Long> at = produce(topic, values(0, n), 16_384);
            Reader a = s.reader("holder", group, topic, Map.of(), null);
            a.holdAfterFirst = true;
            a.start();
            drain("the holder's first batch", List.of(a), g -> !g.isEmpty(), JOIN_MS);
            List<Got> held = a.got();
            long heldAt = a.firstBatchAt;
            s.checkEquals("acquisitionLockTimeoutMs() is the group's share.record.lock.duration.ms", (int) GROUP_LOCK_MS, a.lockTimeoutMs);
            s.check("the holder's batch: delivery count 1", held.stream().allMatch(g -> g.deliveryCount() == 1) ? null : abbreviate(held.toString()));
            Reader b = s.reader("taker", group, topic, Map.of(), null);
            b.start();
            Set<String> heldValues = distinct(held);
            drain("the taker to receive all " + n + " records", List.of(b), g -> distinct(g).size() >= n, GROUP_LOCK_MS + DRAIN_MS);
            quiet(List.of(b), 500);
            s.check("the taker closes cleanly", closedCleanly(List.of(b)));
            List<Got> got = b.got();
            s.check("each delivery at the offset its value was produced at", offsetsMatch(got, at));
            s.check("the taker received every record once", exactlyOnce(got, at.keySet()));
            List<Got> again = got.stream().filter(g -> heldValues.contains(g.value())).toList();
            s.check("the " + heldValues.size() + " held records came back with delivery count 2",
                again.size() == heldValues.size() && again.stream().allMatch(g -> g.deliveryCount() == 2) ? null : abbreviate(again.toString()));
            long first = again.stream().mapToLong(Got::t).min().orElse(Long.MAX_VALUE);
            long waitedMs = (first - heldAt) / 1_000_000;
            s.check("not before the lock expired: at least " + (GROUP_LOCK_MS * 3 / 4) + " ms after the holder got them",
                waitedMs >= GROUP_LOCK_MS * 3 / 4 ? null : "after " + waitedMs + " ms");
            s.note("the held records came back " + waitedMs + " ms after the holder got them");
            List<Got> notHeld = got.stream().filter(g -> !heldValues.contains(g.value())).toList();
            s.check("the records not held: delivery count 1", notHeld.stream().allMatch(g -> g.deliveryCount() == 1) ? null
                : abbreviate(notHeld.toString()));
            // The holder's implicit acknowledgement on close comes too late: it must change nothing.
            a.stopAndClose();
            s.checkEquals("the holder received nothing after its first batch", held.size(), a.got().size());
            s.check("the holder closes cleanly after its lock expired", a.crash == null && a.closeError == null ? null
                : "failed " + a.crash + ", close " + a.closeError);
            s.check("listShareGroupOffsets: lag 0", lagReachesZero(admin, group, tp, endOffset(admin, tp)));
        }
    }

    /**
     * A member in explicit mode takes a batch and renews its lock (RENEW, KIP-1222) every second
     * for more than twice the group's lock duration, then accepts it; another member of the
     * group gets the rest of the topic and never a renewed record.
     */
    private void renew(Scenario s) throws Exception {
        String topic = s.name("t");
        String group = s.name("g");
        TopicPartition tp = new TopicPartition(topic, 0);
        int n = 50;
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
            groupConfig(admin, group, Map.of("share.record.lock.duration.ms", String.valueOf(GROUP_LOCK_MS)));
            // Two batches: the renewer takes the first, the other member the second.
            Map<String, Long> at = produce(topic, values(0, n / 2), 16_384);
            Properties config = new Properties();
            config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            config.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            config.put(ConsumerConfig.CLIENT_ID_CONFIG, "renewer-" + run);
            config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            config.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, "explicit");
            List<ConsumerRecord<String, String>> held = new ArrayList<>();
            List<String> renewErrors = new ArrayList<>();
            List<String> acceptErrors = new ArrayList<>();
            Reader other;
            long renewedFor;
            try (KafkaShareConsumer<String, String> c = new KafkaShareConsumer<>(config)) {
                c.subscribe(List.of(topic));
                long deadline = System.nanoTime() + JOIN_MS * 1_000_000L;
                while (held.isEmpty() && System.nanoTime() < deadline) {
                    for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                        held.add(r);
                    }
                }
                if (held.isEmpty()) {
                    throw new Failure("the renewer got no records in " + JOIN_MS + " ms");
                }
                long heldAt = System.nanoTime();
                at.putAll(produce(topic, values(n / 2, n / 2), 16_384));
                other = s.reader("other", group, topic, Map.of(), null);
                other.start();
                // Renew for 2.5 lock durations, every second. The client hands renewed records
                // back in the next poll (Kafka 4.4's behaviour), to be acknowledged from there.
                List<String> handedBack = new ArrayList<>();
                while (System.nanoTime() - heldAt < GROUP_LOCK_MS * 2_500_000L) {
                    Thread.sleep(1000);
                    for (ConsumerRecord<String, String> r : held) {
                        c.acknowledge(r, AcknowledgeType.RENEW);
                    }
                    c.commitSync(Duration.ofSeconds(10)).forEach((t, e) -> e.ifPresent(x -> renewErrors.add(t + ": " + x)));
                    List<ConsumerRecord<String, String>> again = new ArrayList<>();
                    for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                        again.add(r);
                    }
                    if (!again.stream().map(ConsumerRecord::offset).toList().equals(held.stream().map(ConsumerRecord::offset).toList())) {
                        handedBack.add(again.stream().map(r -> r.offset() + "dc" + r.deliveryCount().orElse((short) -1)).toList().toString());
                    }
                    if (!again.isEmpty()) {
                        held = again;
                    }
                }
                s.check("each renewal hands back exactly the renewed records", handedBack.isEmpty() ? null : abbreviate(handedBack.toString()));
                s.check("renewed records keep delivery count 1", held.stream().allMatch(r -> r.deliveryCount().orElse((short) -1) == 1) ? null
                    : abbreviate(held.toString()));
                renewedFor = (System.nanoTime() - heldAt) / 1_000_000;
                for (ConsumerRecord<String, String> r : held) {
                    c.acknowledge(r, AcknowledgeType.ACCEPT);
                }
                c.commitSync(Duration.ofSeconds(10)).forEach((t, e) -> e.ifPresent(x -> acceptErrors.add(t + ": " + x)));
            }
            Set<String> heldValues = new HashSet<>();
            held.forEach(r -> heldValues.add(r.value()));
            s.note("the renewer held " + held.size() + " records for " + renewedFor + " ms (lock " + GROUP_LOCK_MS + " ms)");
            s.check("RENEW commits reported no error", renewErrors.isEmpty() ? null : abbreviate(renewErrors.toString()));
            s.check("the ACCEPT after the renewals reported no error", acceptErrors.isEmpty() ? null : abbreviate(acceptErrors.toString()));
            Set<String> rest = new HashSet<>(at.keySet());
            rest.removeAll(heldValues);
            drain("the other member to receive the " + rest.size() + " records not held", List.of(other),
                g -> distinct(g).containsAll(rest), DRAIN_MS);
            quiet(List.of(other), GROUP_LOCK_MS + 500);
            other.stopAndClose();
            List<Got> got = other.got();
            List<Got> stolen = got.stream().filter(g -> heldValues.contains(g.value())).toList();
            s.check("the other member never got a renewed record", stolen.isEmpty() ? null : abbreviate(stolen.toString()));
            s.check("the other member got every other record once, delivery count 1", exactlyOnceFirstTime(got, rest));
            s.check("listShareGroupOffsets: lag 0", lagReachesZero(admin, group, tp, endOffset(admin, tp)));
        }
    }

    static String exactlyOnce(List<Got> got, Collection<String> values) {
        Map<String, List<Got>> by = byValue(got);
        List<String> missing = new ArrayList<>();
        List<String> twice = new ArrayList<>();
        for (String v : values) {
            List<Got> l = by.getOrDefault(v, List.of());
            if (l.isEmpty()) {
                missing.add(v);
            } else if (l.size() > 1) {
                twice.add(l.toString());
            }
        }
        List<Got> extra = others(got, values);
        if (missing.isEmpty() && twice.isEmpty() && extra.isEmpty()) {
            return null;
        }
        return missing.size() + " missing " + abbreviate(missing.toString()) + "; " + twice.size() + " more than once "
            + abbreviate(twice.toString()) + "; " + extra.size() + " unexpected " + abbreviate(extra.toString());
    }

    /**
     * A member JVM takes a batch and is killed with SIGKILL holding it; B gets it back. Kafka
     * releases a share session's acquired records when its connection closes, long before the
     * lock (here 15 s) would expire.
     */
    private void lockKilled(Scenario s) throws Exception {
        String topic = s.name("t");
        String group = s.name("g");
        TopicPartition tp = new TopicPartition(topic, 0);
        int n = 50;
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
            groupConfig(admin, group, Map.of("share.record.lock.duration.ms", String.valueOf(KILLED_LOCK_MS)));
            Map<String, Long> at = produce(topic, values(0, n), 16_384);
            Path log = s.dir.resolve("holder.log");
            Process holder = startMember(s, "holder", group, topic, log);
            List<String> received = new ArrayList<>();
            waitUntil("the holder JVM to log its batch", () -> {
                List<String> lines = readLines(log);
                for (String l : lines) {
                    String[] w = l.split(" ");
                    if (w.length > 1 && w[1].equals("failed")) {
                        throw new Failure("the holder failed: " + l);
                    }
                    if (w.length > 1 && w[1].equals("holding")) {
                        for (String x : lines) {
                            if (x.split(" ")[1].equals("received")) {
                                received.add(x);
                            }
                        }
                        return true;
                    }
                }
                if (!holder.isAlive()) {
                    throw new Failure("the holder exited with " + holder.exitValue() + ": " + tail(s.dir.resolve("holder.stderr")));
                }
                return false;
            }, JOIN_MS + DRAIN_MS);
            List<Got> held = new ArrayList<>();
            String[] w = received.get(0).split(" ");
            s.checkEquals("the holder's acquisitionLockTimeoutMs() is the group's share.record.lock.duration.ms",
                String.valueOf(KILLED_LOCK_MS), w[2]);
            for (int i = 3; i < w.length; i++) {
                String[] f = w[i].split(":", 4);
                held.add(new Got("holder", Long.parseLong(w[0]), Integer.parseInt(f[0]), Long.parseLong(f[1]), f[3], Integer.parseInt(f[2])));
            }
            s.check("the holder's batch: delivery count 1, at the produced offsets",
                held.stream().allMatch(g -> g.deliveryCount() == 1) && offsetsMatch(held, at) == null ? null : abbreviate(held.toString()));
            // The taker joins while the holder lives; what the holder holds reaches it only once the
            // holder is gone (and its locks released or expired).
            Reader b = s.reader("taker", group, topic, Map.of(), null);
            b.start();
            waitAssigned(admin, group, 2, Set.of(tp), List.of(b));
            long killedAt = System.nanoTime();
            holder.destroyForcibly();
            if (!holder.waitFor(10, TimeUnit.SECONDS)) {
                throw new Failure("the holder (pid " + holder.pid() + ") survived SIGKILL for 10 s");
            }
            Set<String> heldValues = distinct(held);
            drain("the taker to receive all " + n + " records", List.of(b), g -> distinct(g).size() >= n, KILLED_LOCK_MS + DRAIN_MS);
            quiet(List.of(b), 500);
            s.check("the taker closes cleanly", closedCleanly(List.of(b)));
            List<Got> got = b.got();
            s.check("each delivery at the offset its value was produced at", offsetsMatch(got, at));
            s.check("the taker received every record once: nothing lost", exactlyOnce(got, at.keySet()));
            List<Got> again = got.stream().filter(g -> heldValues.contains(g.value())).toList();
            s.check("the " + heldValues.size() + " records the killed holder had came back with delivery count 2",
                again.size() == heldValues.size() && again.stream().allMatch(g -> g.deliveryCount() == 2) ? null : abbreviate(again.toString()));
            long first = again.stream().mapToLong(Got::t).min().orElse(Long.MAX_VALUE);
            long afterKill = (first - killedAt) / 1_000_000;
            long afterAcquire = (first - held.get(0).t()) / 1_000_000;
            s.check("released when the killed holder's connection closed: back within " + KILLED_LOCK_MS / 2
                    + " ms of the SIGKILL, before the " + KILLED_LOCK_MS + " ms lock could expire",
                afterKill < KILLED_LOCK_MS / 2 && afterAcquire < KILLED_LOCK_MS ? null
                    : afterKill + " ms after the SIGKILL, " + afterAcquire + " ms after the holder got them");
            s.note("the held records came back " + afterKill + " ms after the SIGKILL, " + afterAcquire + " ms after the holder got them");
            s.check("listShareGroupOffsets: lag 0", lagReachesZero(admin, group, tp, endOffset(admin, tp)));
        }
    }

    Process startMember(Scenario s, String name, String group, String topic, Path log) throws IOException {
        List<String> cmd = new ArrayList<>(List.of(
            Path.of(System.getProperty("java.home"), "bin", "java").toString(),
            "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx192m",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", System.getProperty("java.class.path"),
            ShareMember.class.getName(), bootstrap, group, topic, name + "-" + run, log.toString()));
        ProcessBuilder pb = new ProcessBuilder(cmd);
        pb.redirectErrorStream(true);
        pb.redirectOutput(ProcessBuilder.Redirect.appendTo(s.dir.resolve(name + ".stderr").toFile()));
        pb.redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
        Process p = pb.start();
        spawned.add(p);
        s.procs.add(p);
        return p;
    }

    static void kill(Process p) {
        if (p.isAlive()) {
            p.destroyForcibly();
            try {
                p.waitFor(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /** The complete lines of a member log so far. */
    static List<String> readLines(Path log) {
        try {
            String s = Files.readString(log, StandardCharsets.UTF_8);
            int end = s.lastIndexOf('\n');
            if (end < 0) {
                return List.of();
            }
            return List.of(s.substring(0, end).split("\n"));
        } catch (IOException e) {
            return List.of();
        }
    }

    static String tail(Path p) {
        try {
            String s = Files.readString(p, StandardCharsets.UTF_8);
            return abbreviate(s.length() <= 800 ? s : s.substring(s.length() - 800));
        } catch (IOException e) {
            return "(" + e + ")";
        }
    }

    // ---------------------------------------------------------------- 5: read_committed

    private void isolation(Scenario s) throws Exception {
        String topic = s.name("t");
        String rc = s.name("rc");
        String ru = s.name("ru");
        TopicPartition tp = new TopicPartition(topic, 0);
        List<String> committed = new ArrayList<>();
        List<String> aborted = new ArrayList<>();
        for (int i = 0; i < 10; i++) {
            committed.add("c-" + i);
            aborted.add("a-" + i);
        }
        for (int i = 10; i < 20; i++) {
            committed.add("c-" + i);
        }
        Map<String, Long> at = new HashMap<>();
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
            groupConfig(admin, rc, Map.of("share.isolation.level", "read_committed"));
            groupConfig(admin, ru, Map.of("share.isolation.level", "read_uncommitted"));
            Properties p = new Properties();
            p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, s.name("txn"));
            try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
                producer.initTransactions();
                for (int txn = 0; txn < 3; txn++) {
                    List<String> vs = txn == 0 ? committed.subList(0, 10) : txn == 1 ? aborted : committed.subList(10, 20);
                    producer.beginTransaction();
                    List<Future<RecordMetadata>> sent = new ArrayList<>();
                    for (String v : vs) {
                        sent.add(producer.send(new ProducerRecord<>(topic, 0, null, v)));
                    }
                    producer.flush();
                    for (int i = 0; i < vs.size(); i++) {
                        at.put(vs.get(i), sent.get(i).get(20, TimeUnit.SECONDS).offset());
                    }
                    if (txn == 1) {
                        producer.abortTransaction();
                    } else {
                        producer.commitTransaction();
                    }
                }
            }
            Reader a = s.reader("committed", rc, topic, Map.of(), null);
            Reader b = s.reader("uncommitted", ru, topic, Map.of(), null);
            a.start();
            b.start();
            List<String> everything = new ArrayList<>(committed);
            everything.addAll(aborted);
            drain("the read_committed group to receive the committed records", List.of(a, b),
                g -> distinct(a.got()).containsAll(committed) && distinct(b.got()).containsAll(everything), DRAIN_MS);
            quiet(List.of(a, b), 1_000);
            s.check("both consumers close cleanly", closedCleanly(List.of(a, b)));
            s.check("read_committed: each delivery at the offset its value was produced at", offsetsMatch(a.got(), at));
            s.check("read_committed: exactly the 20 committed records, each once", exactlyOnce(a.got(), committed));
            s.check("read_uncommitted: each delivery at the offset its value was produced at", offsetsMatch(b.got(), at));
            s.check("read_uncommitted: the 20 committed and the 10 aborted records, each once", exactlyOnce(b.got(), everything));
            long end = endOffset(admin, tp);
            s.checkEquals("the log end offset (30 records, 3 transaction markers)", 33L, end);
            s.check("read_committed: listShareGroupOffsets lag 0 (aborted records and markers count as done)",
                lagReachesZero(admin, rc, tp, end));
            s.check("read_uncommitted: listShareGroupOffsets lag 0", lagReachesZero(admin, ru, tp, end));
        }
    }

    // ---------------------------------------------------------------- 6: Admin

    private void admin(Scenario s) throws Exception {
        String topic = s.name("t");
        String group = s.name("g");
        TopicPartition tp = new TopicPartition(topic, 0);
        int n = 200;
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
            groupConfig(admin, group, Map.of());
            Map<String, Long> at = produce(topic, values(0, n), 1024);
            Reader r0 = s.reader("m0", group, topic, Map.of(), null);
            Reader r1 = s.reader("m1", group, topic, Map.of(), null);
            r0.start();
            r1.start();
            List<Reader> rs = List.of(r0, r1);
            ShareGroupDescription d = waitAssigned(admin, group, 2, Set.of(tp), rs);
            drain("all " + n + " records", rs, g -> distinct(g).size() >= n, DRAIN_MS);
            d = describe(admin, group);
            s.checkEquals("describeShareGroups: state", GroupState.STABLE, d.groupState());
            Set<String> clients = new HashSet<>();
            for (ShareMemberDescription m : d.members()) {
                clients.add(m.clientId());
            }
            s.checkEquals("describeShareGroups: the members' client ids", Set.of(r0.config.get(ConsumerConfig.CLIENT_ID_CONFIG),
                r1.config.get(ConsumerConfig.CLIENT_ID_CONFIG)), clients);
            List<Set<TopicPartition>> assignments = d.members().stream().map(m -> m.assignment().topicPartitions()).toList();
            s.checkEquals("describeShareGroups: each member assigned the partition", List.of(Set.of(tp), Set.of(tp)), assignments);
            s.check("describeShareGroups: member epochs > 0", d.members().stream().allMatch(m -> m.memberEpoch() > 0) ? null
                : "epochs " + d.members().stream().map(ShareMemberDescription::memberEpoch).toList());
            s.check("listGroups: the group, type SHARE", listed(admin, new ListGroupsOptions(), group, GroupType.SHARE));
            s.check("listGroups(forShareGroups): the group", listed(admin, ListGroupsOptions.forShareGroups(), group, GroupType.SHARE));
            Optional<GroupListing> asConsumer = admin.listGroups(ListGroupsOptions.forConsumerGroups()).all().get(20, TimeUnit.SECONDS)
                .stream().filter(g -> g.groupId().equals(group)).findFirst();
            s.check("listGroups(forConsumerGroups): not the share group", asConsumer.isEmpty() ? null : "listed " + asConsumer.get());
            s.check("deleteShareGroups with members: GroupNotEmptyException", deleteRefused(admin, group));

            s.check("both members close cleanly", closedCleanly(rs));
            List<Got> got = all(rs);
            s.check("all " + n + " records, each once, delivery count 1", exactlyOnceFirstTime(got, at.keySet()));
            s.check("each delivery at the offset its value was produced at", offsetsMatch(got, at));
            long end = endOffset(admin, tp);
            s.check("listShareGroupOffsets after everything was acknowledged: lag 0", lagReachesZero(admin, group, tp, end));
            SharePartitionOffsetInfo info = shareOffset(admin, group, tp);
            s.note("listShareGroupOffsets after everything was acknowledged: " + info);
            waitUntil("the group to be empty", () -> {
                try {
                    ShareGroupDescription x = describe(admin, group);
                    return x.members().isEmpty() && x.groupState() == GroupState.EMPTY;
                } catch (Exception e) {
                    throw new Failure("describeShareGroups: " + e);
                }
            }, 15_000);
            s.pass("describeShareGroups after the members closed: EMPTY, no members");

            // Rewind the empty group; a new member gets the records from there on.
            long to = 150;
            admin.alterShareGroupOffsets(group, Map.of(tp, to)).all().get(20, TimeUnit.SECONDS);
            info = shareOffset(admin, group, tp);
            s.checkEquals("alterShareGroupOffsets to 150: listShareGroupOffsets start offset", to, info == null ? null : info.startOffset());
            Reader again = s.reader("again", group, topic, Map.of(), null);
            again.start();
            List<String> tailValues = values((int) to, n - (int) to);
            drain("the records from offset 150", List.of(again), g -> distinct(g).containsAll(tailValues), DRAIN_MS);
            quiet(List.of(again), 500);
            s.check("after the rewind, a member closes cleanly", closedCleanly(List.of(again)));
            s.check("after the rewind to 150: exactly records 150..199, each once, delivery count 1",
                exactlyOnceFirstTime(again.got(), tailValues) == null && others(again.got(), tailValues).isEmpty() ? null
                    : abbreviate(again.got().toString()));
            s.check("after the rewind: lag 0 again", lagReachesZero(admin, group, tp, end));

            waitUntil("the group to be empty again", () -> {
                try {
                    return describe(admin, group).members().isEmpty();
                } catch (Exception e) {
                    throw new Failure("describeShareGroups: " + e);
                }
            }, 15_000);
            admin.deleteShareGroups(List.of(group)).all().get(20, TimeUnit.SECONDS);
            s.pass("deleteShareGroups on the empty group");
            Optional<GroupListing> left = admin.listGroups(new ListGroupsOptions()).all().get(20, TimeUnit.SECONDS)
                .stream().filter(g -> g.groupId().equals(group)).findFirst();
            s.check("listGroups after the delete: gone", left.isEmpty() ? null : "still listed: " + left.get());
            String why;
            try {
                ShareGroupDescription x = describe(admin, group);
                why = x.groupState() == GroupState.DEAD ? null : "described " + x;
            } catch (ExecutionException e) {
                why = e.getCause() instanceof GroupIdNotFoundException ? null : "threw " + e.getCause();
            }
            s.check("describeShareGroups after the delete: DEAD or GroupIdNotFoundException", why);
        }
    }

    static String listed(Admin admin, ListGroupsOptions options, String group, GroupType type) throws Exception {
        Collection<GroupListing> all = admin.listGroups(options).all().get(20, TimeUnit.SECONDS);
        for (GroupListing g : all) {
            if (g.groupId().equals(group)) {
                return g.type().equals(Optional.of(type)) ? null : "listed as " + g;
            }
        }
        return "not among " + all.size() + " groups listed";
    }

    static String deleteRefused(Admin admin, String group) throws Exception {
        try {
            admin.deleteShareGroups(List.of(group)).all().get(20, TimeUnit.SECONDS);
            return "deleted";
        } catch (ExecutionException e) {
            return e.getCause() instanceof GroupNotEmptyException ? null : "threw " + e.getCause();
        }
    }
}
