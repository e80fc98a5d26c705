package sluice;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.CreateTopicsResult;
import org.apache.kafka.clients.admin.DeletedRecords;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.ListTopicsOptions;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.Utils;

/**
 * Drives a running Sluice broker with Apache Kafka's own Java client: Admin, an idempotent
 * KafkaProducer with the default settings, and a KafkaConsumer without a group (assign + seek).
 *
 * <p>Usage: {@code java -cp ... sluice.JavaClientTest BOOTSTRAP}. Every check prints one line,
 * {@code PASS name} or {@code FAIL name: why}; the last line is {@code java-client: N passed, N
 * failed}. The exit status is 0 only when nothing failed.
 */
public final class JavaClientTest {
    static final int PARTITIONS = 6;
    static final int RECORDS = 20_000;
    static final int DISTINCT_KEYS = 997;
    static final long TIMEOUT_S = 60;

    private final String bootstrap;
    private final String topic = "java-client-" + Long.toHexString(System.nanoTime());
    private int passed;
    private int failed;

    /** What the producer was told and what the broker acknowledged, by send index. */
    private final String[] keys = new String[RECORDS];
    private final String[] values = new String[RECORDS];
    private final long[] timestamps = new long[RECORDS];
    private final int[] ackPartition = new int[RECORDS];
    private final long[] ackOffset = new long[RECORDS];
    private final long[] ackTimestamp = new long[RECORDS];

    private JavaClientTest(String bootstrap) {
        this.bootstrap = bootstrap;
    }

    public static void main(String[] args) {
        if (args.length != 1) {
            System.err.println("usage: sluice.JavaClientTest BOOTSTRAP_SERVERS");
            System.exit(2);
        }
        JavaClientTest t = new JavaClientTest(args[0]);
        t.runAll();
        System.out.printf("java-client: %d passed, %d failed%n", t.passed, t.failed);
        System.exit(t.failed == 0 ? 0 : 1);
    }

    // ---------------------------------------------------------------- checks

    private void pass(String name) {
        passed++;
        System.out.println("PASS " + name);
    }

    private void fail(String name, String why) {
        failed++;
        System.out.println("FAIL " + name + ": " + why);
    }

    private boolean check(String name, boolean ok, String why) {
        if (ok) {
            pass(name);
        } else {
            fail(name, why);
        }
        return ok;
    }

    private boolean checkEquals(String name, Object expected, Object actual) {
        return check(name, java.util.Objects.equals(expected, actual),
            "expected <" + expected + "> but got <" + actual + ">");
    }

    /** A step whose exception fails it (and with it the checks it would have made). */
    private interface Step {
        void run() throws Exception;
    }

    private boolean step(String name, Step s) {
        try {
            s.run();
            return true;
        } catch (Throwable e) {
            Throwable c = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
            fail(name, "threw " + c);
            return false;
        }
    }

    // ---------------------------------------------------------------- clients

    private Admin admin() {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "20000");
        return Admin.create(p);
    }

    private KafkaConsumer<String, String> consumer() {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        // No group.id: groups are not implemented, partitions are assigned by hand.
        p.put(ConsumerConfig.ALLOW_AUTO_CREATE_TOPICS_CONFIG, "false");
        return new KafkaConsumer<>(p);
    }

    private List<TopicPartition> partitions() {
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < PARTITIONS; p++) {
            tps.add(new TopicPartition(topic, p));
        }
        return tps;
    }

    // ---------------------------------------------------------------- the run

    private void runAll() {
        System.out.println("bootstrap " + bootstrap + ", topic " + topic);
        try (Admin admin = admin()) {
            step("describeCluster", () -> cluster(admin));
            if (!step("createTopics", () -> createAndDescribe(admin))) {
                return;
            }
            step("incrementalAlterConfigs", () -> alterConfigs(admin));
            boolean produced = step("produce", this::produce);
            if (produced) {
                step("consume", this::consume);
                step("offsets", () -> offsets(admin));
                step("deleteRecords", () -> deleteRecords(admin));
            }
            step("deleteTopics", () -> deleteTopic(admin));
            step("compression", () -> compression(admin));
            step("concurrent createTopics", () -> concurrentCreates(admin));
        }
    }

    private void cluster(Admin admin) throws Exception {
        var dc = admin.describeCluster();
        Collection<Node> nodes = dc.nodes().get(TIMEOUT_S, TimeUnit.SECONDS);
        checkEquals("describeCluster: one node", 1, nodes.size());
        Node controller = dc.controller().get(TIMEOUT_S, TimeUnit.SECONDS);
        check("describeCluster: controller is that node",
            controller != null && !nodes.isEmpty() && controller.id() == nodes.iterator().next().id(),
            "controller " + controller + ", nodes " + nodes);
        String clusterId = dc.clusterId().get(TIMEOUT_S, TimeUnit.SECONDS);
        check("describeCluster: cluster id", clusterId != null && !clusterId.isEmpty(),
            "cluster id " + clusterId);
    }

    private void createAndDescribe(Admin admin) throws Exception {
        NewTopic nt = new NewTopic(topic, PARTITIONS, (short) 1)
            .configs(Map.of("retention.ms", "86400000", "segment.bytes", "1048576"));
        CreateTopicsResult cr = admin.createTopics(List.of(nt));
        cr.all().get(TIMEOUT_S, TimeUnit.SECONDS);
        pass("createTopics: " + PARTITIONS + " partitions");
        checkEquals("createTopics: result partition count", PARTITIONS,
            cr.numPartitions(topic).get(TIMEOUT_S, TimeUnit.SECONDS));
        checkEquals("createTopics: result replication factor", 1,
            cr.replicationFactor(topic).get(TIMEOUT_S, TimeUnit.SECONDS));

        // Creating it again must fail with TOPIC_ALREADY_EXISTS.
        try {
            admin.createTopics(List.of(new NewTopic(topic, PARTITIONS, (short) 1)))
                .all().get(TIMEOUT_S, TimeUnit.SECONDS);
            fail("createTopics: again is TopicExistsException", "second create succeeded");
        } catch (ExecutionException e) {
            check("createTopics: again is TopicExistsException",
                e.getCause() instanceof TopicExistsException, "got " + e.getCause());
        }

        Set<String> names = admin.listTopics().names().get(TIMEOUT_S, TimeUnit.SECONDS);
        check("listTopics: has the topic", names.contains(topic), "topics " + names);

        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames()
            .get(TIMEOUT_S, TimeUnit.SECONDS).get(topic);
        check("describeTopics: found", d != null, "no description");
        checkEquals("describeTopics: name", topic, d.name());
        check("describeTopics: not internal", !d.isInternal(), "internal");
        check("describeTopics: topic id", d.topicId() != null && !d.topicId().equals(org.apache.kafka.common.Uuid.ZERO_UUID),
            "topic id " + d.topicId());
        checkEquals("describeTopics: partition count", PARTITIONS, d.partitions().size());
        boolean ok = true;
        StringBuilder why = new StringBuilder();
        for (int i = 0; i < d.partitions().size(); i++) {
            TopicPartitionInfo pi = d.partitions().get(i);
            if (pi.partition() != i || pi.leader() == null || pi.replicas().size() != 1
                || pi.isr().size() != 1 || !pi.replicas().get(0).equals(pi.leader())) {
                ok = false;
                why.append(pi).append("; ");
            }
        }
        check("describeTopics: partitions 0..5 led, 1 replica, 1 in ISR", ok, why.toString());

        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Config cfg = admin.describeConfigs(List.of(res)).all().get(TIMEOUT_S, TimeUnit.SECONDS).get(res);
        ConfigEntry retention = cfg.get("retention.ms");
        checkEquals("describeConfigs: retention.ms as created", "86400000",
            retention == null ? null : retention.value());
        checkEquals("describeConfigs: retention.ms source", ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
            retention == null ? null : retention.source());
        ConfigEntry segment = cfg.get("segment.bytes");
        checkEquals("describeConfigs: segment.bytes as created", "1048576",
            segment == null ? null : segment.value());
        ConfigEntry cleanup = cfg.get("cleanup.policy");
        checkEquals("describeConfigs: cleanup.policy default", "delete",
            cleanup == null ? null : cleanup.value());
        check("describeConfigs: cleanup.policy is a default",
            cleanup != null && cleanup.source() != ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
            "source " + (cleanup == null ? null : cleanup.source()));
    }

    private void alterConfigs(Admin admin) throws Exception {
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Map<ConfigResource, Collection<AlterConfigOp>> ops = Map.of(res, List.of(
            new AlterConfigOp(new ConfigEntry("retention.ms", "172800000"), AlterConfigOp.OpType.SET),
            new AlterConfigOp(new ConfigEntry("max.message.bytes", "2097152"), AlterConfigOp.OpType.SET),
            new AlterConfigOp(new ConfigEntry("segment.bytes", ""), AlterConfigOp.OpType.DELETE)));
        admin.incrementalAlterConfigs(ops).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        pass("incrementalAlterConfigs: accepted");
        Config cfg = admin.describeConfigs(List.of(res)).all().get(TIMEOUT_S, TimeUnit.SECONDS).get(res);
        ConfigEntry retention = cfg.get("retention.ms");
        checkEquals("incrementalAlterConfigs: retention.ms SET", "172800000",
            retention == null ? null : retention.value());
        ConfigEntry maxMessage = cfg.get("max.message.bytes");
        checkEquals("incrementalAlterConfigs: max.message.bytes SET", "2097152",
            maxMessage == null ? null : maxMessage.value());
        ConfigEntry segment = cfg.get("segment.bytes");
        check("incrementalAlterConfigs: segment.bytes DELETE reverts to a default",
            segment != null && segment.source() != ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG
                && !"1048576".equals(segment.value()),
            "segment.bytes " + segment);

        // An unknown config name is refused, and nothing changes.
        try {
            admin.incrementalAlterConfigs(Map.of(res, List.of(new AlterConfigOp(
                new ConfigEntry("no.such.config", "1"), AlterConfigOp.OpType.SET))))
                .all().get(TIMEOUT_S, TimeUnit.SECONDS);
            fail("incrementalAlterConfigs: unknown name refused", "accepted no.such.config");
        } catch (ExecutionException e) {
            check("incrementalAlterConfigs: unknown name refused",
                e.getCause() instanceof org.apache.kafka.common.errors.InvalidConfigurationException
                    || e.getCause() instanceof org.apache.kafka.common.errors.InvalidRequestException,
                "got " + e.getCause());
        }
    }

    private void produce() throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        // Everything else is the producer's default: enable.idempotence=true, acks=all,
        // max.in.flight.requests.per.connection=5, linger.ms=5, batch.size=16384, no compression.

        // Timestamps one millisecond apart, in the recent past, so offsetsForTimes has exact answers.
        long base = System.currentTimeMillis() - 600_000;
        AtomicInteger acked = new AtomicInteger();
        AtomicReference<Exception> firstError = new AtomicReference<>();
        AtomicInteger errors = new AtomicInteger();
        for (int i = 0; i < RECORDS; i++) {
            ackPartition[i] = -1;
            ackOffset[i] = -1;
        }
        long start = System.nanoTime();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < RECORDS && errors.get() == 0; i++) {
                keys[i] = "key-" + (i % DISTINCT_KEYS);
                values[i] = valueOf(i);
                timestamps[i] = base + i;
                RecordHeaders headers = new RecordHeaders();
                headers.add("seq", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
                headers.add("src", "sluice-java-test".getBytes(StandardCharsets.UTF_8));
                if (i % 10 == 0) {
                    // A repeated header name and a header with a null value.
                    headers.add("src", "again".getBytes(StandardCharsets.UTF_8));
                    headers.add("nothing", null);
                }
                final int idx = i;
                producer.send(new ProducerRecord<>(topic, null, timestamps[i], keys[i], values[i], headers),
                    (RecordMetadata md, Exception e) -> {
                        if (e != null) {
                            errors.incrementAndGet();
                            firstError.compareAndSet(null, e);
                            return;
                        }
                        ackPartition[idx] = md.partition();
                        ackOffset[idx] = md.offset();
                        ackTimestamp[idx] = md.timestamp();
                        acked.incrementAndGet();
                    });
            }
            producer.flush();
        }
        System.out.printf("produced %d records in %.1f s%n", RECORDS, (System.nanoTime() - start) / 1e9);

        check("produce: every send acknowledged without error", errors.get() == 0 && acked.get() == RECORDS,
            errors.get() + " errors, " + acked.get() + " acked; first error " + firstError.get());

        // Same key, same partition, and the one the default partitioner picks (murmur2 of the key).
        Map<String, Integer> keyPartition = new HashMap<>();
        int moved = 0;
        int misplaced = 0;
        for (int i = 0; i < RECORDS; i++) {
            if (ackPartition[i] < 0) {
                continue;
            }
            Integer prev = keyPartition.putIfAbsent(keys[i], ackPartition[i]);
            if (prev != null && prev != ackPartition[i]) {
                moved++;
            }
            int expected = Utils.toPositive(Utils.murmur2(keys[i].getBytes(StandardCharsets.UTF_8))) % PARTITIONS;
            if (expected != ackPartition[i]) {
                misplaced++;
            }
        }
        check("produce: RecordMetadata partition is stable per key", moved == 0, moved + " records moved");
        check("produce: RecordMetadata partition is murmur2(key) % 6", misplaced == 0, misplaced + " misplaced");

        // Offsets: in send order, per partition, exactly 0, 1, 2, ... (a fresh topic, one producer).
        long[] next = new long[PARTITIONS];
        String firstGap = null;
        int gaps = 0;
        for (int i = 0; i < RECORDS; i++) {
            int part = ackPartition[i];
            if (part < 0 || part >= PARTITIONS) {
                continue;
            }
            if (ackOffset[i] != next[part]) {
                gaps++;
                if (firstGap == null) {
                    firstGap = "record " + i + " in partition " + part + " got offset " + ackOffset[i]
                        + ", expected " + next[part];
                }
            }
            next[part] = ackOffset[i] + 1;
        }
        check("produce: offsets 0,1,2,... in send order per partition", gaps == 0, gaps + " out of place; " + firstGap);
        int used = 0;
        for (long n : next) {
            if (n > 0) {
                used++;
            }
        }
        checkEquals("produce: records landed in all 6 partitions", PARTITIONS, used);
        int badTs = 0;
        for (int i = 0; i < RECORDS; i++) {
            if (ackPartition[i] >= 0 && ackTimestamp[i] != timestamps[i]) {
                badTs++;
            }
        }
        check("produce: RecordMetadata timestamp is the CreateTime sent", badTs == 0, badTs + " differ");
    }

    private static String valueOf(int i) {
        if (i % 100 == 99) {
            return null; // a tombstone now and then
        }
        StringBuilder sb = new StringBuilder("value-").append(i).append('-');
        for (int j = 0; j < i % 200; j++) {
            sb.append((char) ('a' + (i + j) % 26));
        }
        return sb.toString();
    }

    private void consume() throws Exception {
        List<ConsumerRecord<String, String>> got = new ArrayList<>();
        try (KafkaConsumer<String, String> c = consumer()) {
            c.assign(partitions());
            c.seekToBeginning(partitions());
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(TIMEOUT_S);
            while (got.size() < RECORDS && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                    got.add(r);
                }
            }
            // Nothing more must come.
            ConsumerRecords<String, String> extra = c.poll(Duration.ofSeconds(1));
            for (ConsumerRecord<String, String> r : extra) {
                got.add(r);
            }
        }
        checkEquals("consume: record count", RECORDS, got.size());

        long[] next = new long[PARTITIONS];
        int outOfOrder = 0;
        int mismatched = 0;
        int wrongHeaders = 0;
        boolean[] seen = new boolean[RECORDS];
        int duplicates = 0;
        String firstProblem = null;
        Map<String, Integer> keyPartition = new HashMap<>();
        int keyMoved = 0;
        for (ConsumerRecord<String, String> r : got) {
            int part = r.partition();
            if (r.offset() != next[part]) {
                outOfOrder++;
                if (firstProblem == null) {
                    firstProblem = "partition " + part + " offset " + r.offset() + " after " + (next[part] - 1);
                }
            }
            next[part] = r.offset() + 1;
            Integer prev = keyPartition.putIfAbsent(r.key(), part);
            if (prev != null && prev != part) {
                keyMoved++;
            }
            Header seqH = r.headers().lastHeader("seq");
            int seq = seqH == null ? -1 : Integer.parseInt(new String(seqH.value(), StandardCharsets.UTF_8));
            if (seq < 0 || seq >= RECORDS) {
                wrongHeaders++;
                continue;
            }
            if (seen[seq]) {
                duplicates++;
            }
            seen[seq] = true;
            if (ackPartition[seq] != part || ackOffset[seq] != r.offset()
                || !java.util.Objects.equals(keys[seq], r.key())
                || !java.util.Objects.equals(values[seq], r.value())
                || r.timestamp() != timestamps[seq]
                || r.timestampType() != org.apache.kafka.common.record.TimestampType.CREATE_TIME) {
                mismatched++;
                if (firstProblem == null) {
                    firstProblem = "seq " + seq + ": got p" + part + "@" + r.offset() + " key=" + r.key()
                        + " ts=" + r.timestamp() + " " + r.timestampType() + " value=" + abbreviate(r.value())
                        + "; sent p" + ackPartition[seq] + "@" + ackOffset[seq] + " key=" + keys[seq]
                        + " ts=" + timestamps[seq] + " value=" + abbreviate(values[seq]);
                }
            }
            List<String> hs = new ArrayList<>();
            for (Header h : r.headers()) {
                hs.add(h.key() + "=" + (h.value() == null ? "<null>" : new String(h.value(), StandardCharsets.UTF_8)));
            }
            List<String> expected = new ArrayList<>(List.of("seq=" + seq, "src=sluice-java-test"));
            if (seq % 10 == 0) {
                expected.add("src=again");
                expected.add("nothing=<null>");
            }
            if (!hs.equals(expected)) {
                wrongHeaders++;
                if (firstProblem == null) {
                    firstProblem = "seq " + seq + " headers " + hs + ", expected " + expected;
                }
            }
        }
        int missing = 0;
        for (boolean s : seen) {
            if (!s) {
                missing++;
            }
        }
        check("consume: per-partition offsets 0,1,2,... in order", outOfOrder == 0,
            outOfOrder + " out of order; " + firstProblem);
        check("consume: every record once", missing == 0 && duplicates == 0,
            missing + " missing, " + duplicates + " duplicated");
        check("consume: key, value, timestamp, partition and offset as produced", mismatched == 0,
            mismatched + " differ; first: " + firstProblem);
        check("consume: key -> partition stable", keyMoved == 0, keyMoved + " moved");
        check("consume: headers (order, repeats, null values)", wrongHeaders == 0,
            wrongHeaders + " wrong; first: " + firstProblem);
    }

    private static String abbreviate(String s) {
        return s == null ? "<null>" : s.length() <= 40 ? s : s.substring(0, 40) + "...";
    }

    /** Per partition: the send indexes of its records, in offset order. */
    private Map<Integer, List<Integer>> byPartition() {
        Map<Integer, List<Integer>> m = new TreeMap<>();
        for (int p = 0; p < PARTITIONS; p++) {
            m.put(p, new ArrayList<>());
        }
        for (int i = 0; i < RECORDS; i++) {
            if (ackPartition[i] >= 0) {
                m.get(ackPartition[i]).add(i);
            }
        }
        for (List<Integer> l : m.values()) {
            l.sort((a, b) -> Long.compare(ackOffset[a], ackOffset[b]));
        }
        return m;
    }

    private void offsets(Admin admin) throws Exception {
        Map<Integer, List<Integer>> parts = byPartition();
        try (KafkaConsumer<String, String> c = consumer()) {
            Duration t = Duration.ofSeconds(TIMEOUT_S);
            Map<TopicPartition, Long> begin = c.beginningOffsets(partitions(), t);
            Map<TopicPartition, Long> end = c.endOffsets(partitions(), t);
            Map<TopicPartition, Long> wantBegin = new HashMap<>();
            Map<TopicPartition, Long> wantEnd = new HashMap<>();
            for (TopicPartition tp : partitions()) {
                wantBegin.put(tp, 0L);
                wantEnd.put(tp, (long) parts.get(tp.partition()).size());
            }
            checkEquals("beginningOffsets: all 0", wantBegin, begin);
            checkEquals("endOffsets: the record count of each partition", wantEnd, end);

            // offsetsForTimes: for several targets, the first offset whose timestamp is >= target.
            long base = timestamps[0];
            long[] targets = {base - 1000, base, base + 1, base + 4321, base + 12345, base + RECORDS - 1};
            int wrong = 0;
            String firstWrong = null;
            for (long target : targets) {
                Map<TopicPartition, Long> query = new HashMap<>();
                for (TopicPartition tp : partitions()) {
                    query.put(tp, target);
                }
                Map<TopicPartition, OffsetAndTimestamp> res = c.offsetsForTimes(query, t);
                for (TopicPartition tp : partitions()) {
                    OffsetAndTimestamp want = null;
                    for (int idx : parts.get(tp.partition())) {
                        if (timestamps[idx] >= target) {
                            want = new OffsetAndTimestamp(ackOffset[idx], timestamps[idx]);
                            break;
                        }
                    }
                    OffsetAndTimestamp have = res.get(tp);
                    // Compared without the leader epoch, which the client passes through.
                    boolean same = want == null ? have == null
                        : have != null && have.offset() == want.offset() && have.timestamp() == want.timestamp();
                    if (!same) {
                        wrong++;
                        if (firstWrong == null) {
                            firstWrong = tp + " target " + (target - base) + " past the first: expected " + want + ", got " + have;
                        }
                    }
                }
            }
            check("offsetsForTimes: first offset at or after each timestamp", wrong == 0,
                wrong + " wrong; first: " + firstWrong);

            Map<TopicPartition, Long> future = new HashMap<>();
            for (TopicPartition tp : partitions()) {
                future.put(tp, base + RECORDS + 3_600_000L);
            }
            Map<TopicPartition, OffsetAndTimestamp> none = c.offsetsForTimes(future, t);
            check("offsetsForTimes: a timestamp after every record gives null",
                none.values().stream().allMatch(v -> v == null), "got " + none);
        }

        // The same through Admin.listOffsets, plus the max-timestamp spec.
        Map<TopicPartition, OffsetSpec> specs = new HashMap<>();
        for (TopicPartition tp : partitions()) {
            specs.put(tp, OffsetSpec.latest());
        }
        Map<TopicPartition, ListOffsetsResultInfo> latest = admin.listOffsets(specs).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        int wrongLatest = 0;
        for (TopicPartition tp : partitions()) {
            if (latest.get(tp).offset() != parts.get(tp.partition()).size()) {
                wrongLatest++;
            }
        }
        check("Admin.listOffsets latest: the record counts", wrongLatest == 0, "got " + latest);

        specs.replaceAll((tp, s) -> OffsetSpec.maxTimestamp());
        Map<TopicPartition, ListOffsetsResultInfo> max = admin.listOffsets(specs).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        int wrongMax = 0;
        String firstMax = null;
        for (TopicPartition tp : partitions()) {
            List<Integer> l = parts.get(tp.partition());
            int last = l.get(l.size() - 1);
            ListOffsetsResultInfo info = max.get(tp);
            if (info.offset() != ackOffset[last] || info.timestamp() != timestamps[last]) {
                wrongMax++;
                if (firstMax == null) {
                    firstMax = tp + ": expected offset " + ackOffset[last] + " ts " + timestamps[last] + ", got " + info;
                }
            }
        }
        check("Admin.listOffsets maxTimestamp: the last record", wrongMax == 0, firstMax);
    }

    private void deleteRecords(Admin admin) throws Exception {
        Map<Integer, List<Integer>> parts = byPartition();
        // Partition p (0..4): delete the first p tenths of its records, none for partition 0.
        Map<TopicPartition, RecordsToDelete> req = new HashMap<>();
        Map<TopicPartition, Long> want = new HashMap<>();
        for (TopicPartition tp : partitions()) {
            long n = parts.get(tp.partition()).size();
            long before = n * tp.partition() / 10;
            req.put(tp, RecordsToDelete.beforeOffset(before));
            want.put(tp, before);
        }
        // Partition 5: every record, up to its end offset.
        TopicPartition all = new TopicPartition(topic, PARTITIONS - 1);
        long allEnd = parts.get(PARTITIONS - 1).size();
        req.put(all, RecordsToDelete.beforeOffset(allEnd));
        want.put(all, allEnd);

        Map<TopicPartition, Long> lows = new HashMap<>();
        var res = admin.deleteRecords(req).lowWatermarks();
        for (var e : res.entrySet()) {
            DeletedRecords dr = e.getValue().get(TIMEOUT_S, TimeUnit.SECONDS);
            lows.put(e.getKey(), dr.lowWatermark());
        }
        checkEquals("deleteRecords: low watermarks as requested", want, lows);

        try (KafkaConsumer<String, String> c = consumer()) {
            Duration t = Duration.ofSeconds(TIMEOUT_S);
            checkEquals("deleteRecords: beginningOffsets moved", want, c.beginningOffsets(partitions(), t));
            Map<TopicPartition, Long> wantEnd = new HashMap<>();
            for (TopicPartition tp : partitions()) {
                wantEnd.put(tp, (long) parts.get(tp.partition()).size());
            }
            checkEquals("deleteRecords: endOffsets unchanged", wantEnd, c.endOffsets(partitions(), t));

            // Reading from the beginning of partition 3 starts at its new low watermark.
            TopicPartition tp3 = new TopicPartition(topic, 3);
            c.assign(List.of(tp3));
            c.seekToBeginning(List.of(tp3));
            ConsumerRecord<String, String> first = null;
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(TIMEOUT_S);
            while (first == null && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                    first = r;
                    break;
                }
            }
            checkEquals("deleteRecords: a consumer from the beginning starts at the low watermark",
                want.get(tp3), first == null ? null : first.offset());

            // Fetching below the low watermark is OFFSET_OUT_OF_RANGE, on which the consumer
            // resets as auto.offset.reset says; the default, latest, puts it at the end.
            c.seek(tp3, 0);
            ConsumerRecords<String, String> afterReset = c.poll(Duration.ofSeconds(3));
            long pos = c.position(tp3, t);
            check("deleteRecords: a fetch below the low watermark resets (latest) to the end",
                afterReset.isEmpty() && pos == wantEnd.get(tp3),
                afterReset.count() + " records, position " + pos + ", end " + wantEnd.get(tp3));
        }

        Map<TopicPartition, OffsetSpec> specs = new HashMap<>();
        for (TopicPartition tp : partitions()) {
            specs.put(tp, OffsetSpec.earliest());
        }
        Map<TopicPartition, ListOffsetsResultInfo> earliest = admin.listOffsets(specs).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        Map<TopicPartition, Long> earliestOffsets = new HashMap<>();
        earliest.forEach((tp, info) -> earliestOffsets.put(tp, info.offset()));
        checkEquals("deleteRecords: Admin.listOffsets earliest moved", want, earliestOffsets);
    }

    /**
     * Each compression codec of the producer, into one topic that Metadata auto-creates (the
     * producer asks for a topic that does not exist yet), read back by a consumer.
     */
    private void compression(Admin admin) throws Exception {
        String t = topic + "-codecs";
        String[] codecs = {"none", "gzip", "snappy", "lz4", "zstd"};
        int perCodec = 1000;
        Map<String, String> sent = new HashMap<>();
        for (String codec : codecs) {
            Properties p = new Properties();
            p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
            p.put(ProducerConfig.LINGER_MS_CONFIG, "20");
            // A topic that never shows up must not block each send for a minute.
            p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "15000");
            AtomicInteger errors = new AtomicInteger();
            AtomicReference<Exception> firstError = new AtomicReference<>();
            try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
                for (int i = 0; i < perCodec && errors.get() == 0; i++) {
                    String key = codec + "-" + i;
                    String value = codec + " record " + i + " " + "compressible ".repeat(i % 20);
                    sent.put(key, value);
                    producer.send(new ProducerRecord<>(t, key, value), (md, e) -> {
                        if (e != null) {
                            errors.incrementAndGet();
                            firstError.compareAndSet(null, e);
                        }
                    });
                }
                producer.flush();
            }
            check("compression " + codec + ": every send acknowledged", errors.get() == 0,
                errors.get() + " errors, first " + firstError.get());
        }

        TopicDescription d = admin.describeTopics(List.of(t)).allTopicNames()
            .get(TIMEOUT_S, TimeUnit.SECONDS).get(t);
        check("compression: the topic was auto-created", d != null && !d.partitions().isEmpty(), "description " + d);
        List<TopicPartition> tps = new ArrayList<>();
        for (TopicPartitionInfo pi : d.partitions()) {
            tps.add(new TopicPartition(t, pi.partition()));
        }
        Map<String, String> got = new HashMap<>();
        int dup = 0;
        try (KafkaConsumer<String, String> c = consumer()) {
            c.assign(tps);
            c.seekToBeginning(tps);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(TIMEOUT_S);
            while (got.size() < sent.size() && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                    if (got.put(r.key(), r.value()) != null) {
                        dup++;
                    }
                }
            }
        }
        int wrong = 0;
        String firstWrong = null;
        for (var e : sent.entrySet()) {
            if (!e.getValue().equals(got.get(e.getKey()))) {
                wrong++;
                if (firstWrong == null) {
                    firstWrong = e.getKey() + " -> " + abbreviate(got.get(e.getKey()));
                }
            }
        }
        check("compression: every codec's records read back intact", wrong == 0 && dup == 0 && got.size() == sent.size(),
            wrong + " wrong or missing, " + dup + " duplicated, " + got.size() + " read; first " + firstWrong);
        admin.deleteTopics(List.of(t)).all().get(TIMEOUT_S, TimeUnit.SECONDS);
    }

    /**
     * Topics created at the same moment over separate connections (which the broker may serve on
     * different shards): every one is visible to every later connection.
     */
    private void concurrentCreates(Admin admin) throws Exception {
        int n = 8;
        List<String> names = new ArrayList<>();
        List<Admin> admins = new ArrayList<>();
        try {
            List<org.apache.kafka.common.KafkaFuture<Void>> futures = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                admins.add(admin());
                names.add(topic + "-concurrent-" + i);
            }
            for (int i = 0; i < n; i++) {
                futures.add(admins.get(i).createTopics(List.of(new NewTopic(names.get(i), 2, (short) 1))).all());
            }
            int createFailures = 0;
            for (var f : futures) {
                try {
                    f.get(TIMEOUT_S, TimeUnit.SECONDS);
                } catch (ExecutionException e) {
                    createFailures++;
                }
            }
            checkEquals("concurrent createTopics: all " + n + " succeed", 0, createFailures);
            int incomplete = 0;
            String firstIncomplete = null;
            for (int r = 0; r < 6; r++) {
                try (Admin fresh = admin()) {
                    Set<String> listed = fresh.listTopics().names().get(TIMEOUT_S, TimeUnit.SECONDS);
                    List<String> missing = new ArrayList<>(names);
                    missing.removeAll(listed);
                    if (!missing.isEmpty()) {
                        incomplete++;
                        if (firstIncomplete == null) {
                            firstIncomplete = "listing " + r + " misses " + missing;
                        }
                    }
                }
            }
            check("concurrent createTopics: every topic listed on 6 new connections", incomplete == 0,
                incomplete + " listings incomplete; " + firstIncomplete);
        } finally {
            for (Admin a : admins) {
                a.close();
            }
        }
        admin.deleteTopics(names).all().get(TIMEOUT_S, TimeUnit.SECONDS);
    }

    private void deleteTopic(Admin admin) throws Exception {
        admin.deleteTopics(List.of(topic)).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        pass("deleteTopics: accepted");
        Set<String> names = null;
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
        do {
            names = admin.listTopics(new ListTopicsOptions().listInternal(true)).names().get(TIMEOUT_S, TimeUnit.SECONDS);
            if (!names.contains(topic)) {
                break;
            }
            Thread.sleep(200);
        } while (System.nanoTime() < deadline);
        check("deleteTopics: gone from listTopics", !names.contains(topic), "still listed: " + names);
        try {
            TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames()
                .get(TIMEOUT_S, TimeUnit.SECONDS).get(topic);
            fail("deleteTopics: describeTopics is UnknownTopicOrPartition", "described " + d);
        } catch (ExecutionException e) {
            check("deleteTopics: describeTopics is UnknownTopicOrPartition",
                e.getCause() instanceof UnknownTopicOrPartitionException, "got " + e.getCause());
        }
        try {
            admin.deleteTopics(List.of(topic)).all().get(TIMEOUT_S, TimeUnit.SECONDS);
            fail("deleteTopics: again is UnknownTopicOrPartition", "second delete succeeded");
        } catch (ExecutionException e) {
            check("deleteTopics: again is UnknownTopicOrPartition",
                e.getCause() instanceof UnknownTopicOrPartitionException, "got " + e.getCause());
        }
    }
}
