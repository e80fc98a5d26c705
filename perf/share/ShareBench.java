import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.BitSet;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

import org.HdrHistogram.Histogram;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.admin.ShareMemberDescription;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The share-group benchmark's load (perf/share_bench.py runs it; issue 29): one topic of one
 * partition, N share consumers ({@link KafkaShareConsumer}, one thread each) in one share group,
 * 1 KiB records, every record acknowledged on its own in explicit mode
 * ({@code acknowledge(record, ACCEPT)}) and the batch committed with {@code commitSync()} before
 * the next poll: a queue worker that knows its results were recorded before it takes more work.
 * A record counts as acknowledged when the commitSync that carried its ACCEPT returned without an
 * error for the partition; its end-to-end latency is that moment minus its CreateTime (the
 * producer's timestamp, whole milliseconds, on the same host's clock).
 *
 * <p>Two phases, one per invocation ({@code --phase}):
 * <ul>
 * <li>{@code drain}: the topic is first filled with {@code --prefill} records at the producer's
 * maximum rate, then the consumers start and drain it. Figure: records acknowledged per second
 * over a steady window in the acknowledgements' own time: from {@code --warmup} s after the first
 * acknowledgement or 10 % of the backlog acknowledged, whichever is first, to {@code --duration}
 * s later or 90 % acknowledged, whichever is first; then the rest is drained (up to
 * {@code --drain-timeout} s from the consumers' start) to check completeness.
 * <li>{@code rate}: the consumers join first (until describeShareGroups shows every member with
 * the partition), then one producer thread sends at {@code --rate} records/s for
 * {@code --warmup + --duration} s. Figures: records acknowledged per second in the measured
 * window, and end-to-end latency of the records produced in it. Then the backlog, if any, is
 * drained to check completeness.
 * </ul>
 *
 * <p>Both phases report every delivery with deliveryCount &gt; 1, offsets delivered or
 * acknowledged more than once, acknowledgement errors (commitSync's per-partition exceptions),
 * client exceptions by message, and whether every produced offset was acknowledged. The last line
 * of stdout is one JSON object; progress goes to stderr. A watchdog ends the JVM after
 * {@code --max-seconds} with a JSON line saying so.
 *
 * <p>Before any consumer joins it sets the group configs {@code share.auto.offset.reset=earliest}
 * and {@code share.assignment.interval.ms=0} with incrementalAlterConfigs (GROUP resource).
 */
public final class ShareBench {
    static String bootstrap = "127.0.0.1:9092";
    static String phase = "drain";
    static int consumers = 16;
    static int recordBytes = 1024;
    static long prefill = 300_000;
    static double rate = 10_000;
    static double warmupS = 10;
    static double durationS = 30;
    static double drainTimeoutS = 120;
    static double maxSeconds = 400;
    static String runId = Long.toString(System.currentTimeMillis() % 10_000_000_000L, 36);

    static final long START_NS = System.nanoTime();
    static final AtomicLong ACKED = new AtomicLong();
    static final AtomicLong DELIVERED = new AtomicLong();
    static final Map<String, Integer> EXCEPTIONS = new ConcurrentHashMap<>();
    static volatile boolean stopConsumers;
    /** The rate phase's measured window in epoch ms of CreateTime: [from, to). */
    static volatile long windowFromMs = Long.MAX_VALUE;
    static volatile long windowToMs = Long.MAX_VALUE;

    static void log(String msg) {
        System.err.printf(Locale.ROOT, "[sharebench %7.1f s] %s%n", (System.nanoTime() - START_NS) / 1e9, msg);
        System.err.flush();
    }

    static long nowMicros() {
        Instant i = Instant.now();
        return i.getEpochSecond() * 1_000_000L + i.getNano() / 1_000;
    }

    static double sinceStartS() {
        return (System.nanoTime() - START_NS) / 1e9;
    }

    static void exception(String where, Throwable e) {
        String key = where + ": " + e.getClass().getName() + ": " + e.getMessage();
        if (key.length() > 300) {
            key = key.substring(0, 300);
        }
        Integer before = EXCEPTIONS.merge(key, 1, Integer::sum);
        if (before == 1) {
            log("first " + key);
        }
    }

    /** A growable array of longs. */
    static final class Longs {
        long[] a = new long[1 << 14];
        int n;

        void add(long v) {
            if (n == a.length) {
                a = Arrays.copyOf(a, a.length * 2);
            }
            a[n++] = v;
        }
    }

    /** One share consumer and its thread; everything it records is its own until it stops. */
    static final class Worker extends Thread {
        final int id;
        final String group;
        final String topic;
        final Longs deliveredOffsets = new Longs();
        final Longs ackedOffsets = new Longs();
        final Histogram latencyUs = new Histogram(3_600_000_000L, 3);
        final Histogram latencyAllUs = new Histogram(3_600_000_000L, 3);
        final Histogram commitUs = new Histogram(3_600_000_000L, 3);
        long redeliveries;
        int maxDeliveryCount;
        long ackErrorBatches;
        long ackErrorRecords;
        long polls;
        long emptyPolls;
        long batchRecordsMax;
        volatile int lockTimeoutMs = -1;
        volatile Throwable crash;
        volatile String closeError;

        Worker(int id, String group, String topic) {
            super("share-consumer-" + id);
            setDaemon(true);
            this.id = id;
            this.group = group;
            this.topic = topic;
        }

        @Override
        public void run() {
            Properties p = new Properties();
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            p.put(ConsumerConfig.CLIENT_ID_CONFIG, "sharebench-" + runId + "-c" + id);
            p.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, "explicit");
            KafkaShareConsumer<byte[], byte[]> c;
            try {
                c = new KafkaShareConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
            } catch (Throwable e) {
                crash = e;
                exception("consumer construct", e);
                return;
            }
            try {
                c.subscribe(List.of(topic));
                while (!stopConsumers) {
                    ConsumerRecords<byte[], byte[]> records;
                    try {
                        records = c.poll(Duration.ofMillis(100));
                    } catch (KafkaException e) {
                        exception("poll", e);
                        Thread.sleep(100);
                        continue;
                    }
                    polls++;
                    if (records.isEmpty()) {
                        emptyPolls++;
                        continue;
                    }
                    if (lockTimeoutMs < 0) {
                        lockTimeoutMs = c.acquisitionLockTimeoutMs().orElse(-1);
                    }
                    int n = records.count();
                    batchRecordsMax = Math.max(batchRecordsMax, n);
                    long[] offsets = new long[n];
                    long[] stamps = new long[n];
                    int i = 0;
                    for (ConsumerRecord<byte[], byte[]> r : records) {
                        // The work of a queue worker would go here; this one only acknowledges.
                        c.acknowledge(r, AcknowledgeType.ACCEPT);
                        offsets[i] = r.offset();
                        stamps[i] = r.timestamp();
                        int dc = r.deliveryCount().map(Short::intValue).orElse(-1);
                        if (dc > 1) {
                            redeliveries++;
                        }
                        maxDeliveryCount = Math.max(maxDeliveryCount, dc);
                        deliveredOffsets.add(r.offset());
                        i++;
                    }
                    DELIVERED.addAndGet(n);
                    long before = System.nanoTime();
                    Map<TopicIdPartition, Optional<KafkaException>> res;
                    try {
                        res = c.commitSync(Duration.ofSeconds(30));
                    } catch (KafkaException e) {
                        exception("commitSync", e);
                        ackErrorBatches++;
                        ackErrorRecords += n;
                        continue;
                    }
                    long doneUs = nowMicros();
                    commitUs.recordValue(Math.max(0, (System.nanoTime() - before) / 1_000));
                    boolean failed = false;
                    for (Map.Entry<TopicIdPartition, Optional<KafkaException>> e : res.entrySet()) {
                        if (e.getValue().isPresent()) {
                            failed = true;
                            exception("commitSync result", e.getValue().get());
                        }
                    }
                    if (res.isEmpty()) {
                        // Nothing confirmed: count it as an error, never as acknowledged.
                        failed = true;
                        EXCEPTIONS.merge("commitSync returned no partition", 1, Integer::sum);
                    }
                    if (failed) {
                        ackErrorBatches++;
                        ackErrorRecords += n;
                        continue;
                    }
                    long from = windowFromMs;
                    long to = windowToMs;
                    for (int k = 0; k < n; k++) {
                        long lat = Math.max(0, doneUs - stamps[k] * 1_000);
                        latencyAllUs.recordValue(Math.min(lat, 3_600_000_000L));
                        if (stamps[k] >= from && stamps[k] < to) {
                            latencyUs.recordValue(Math.min(lat, 3_600_000_000L));
                        }
                        ackedOffsets.add(offsets[k]);
                    }
                    ACKED.addAndGet(n);
                }
            } catch (Throwable e) {
                crash = e;
                exception("consumer thread", e);
            } finally {
                try {
                    c.close(Duration.ofSeconds(10));
                } catch (Throwable e) {
                    closeError = e.toString();
                    exception("close", e);
                }
            }
        }
    }

    /** The producer's side: which offsets the broker gave, and send errors. */
    static final class Produced {
        final BitSet offsets = new BitSet();
        long count;
        long errors;
        long maxOffset = -1;

        synchronized void ok(long offset) {
            offsets.set((int) offset);
            count++;
            maxOffset = Math.max(maxOffset, offset);
        }

        synchronized void failed(Exception e) {
            errors++;
            exception("send", e);
        }
    }

    static KafkaProducer<byte[], byte[]> producer() {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "sharebench-" + runId + "-producer");
        // The Java producer's defaults otherwise: acks=all, idempotent, linger.ms=5,
        // batch.size=16384, no compression.
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        return new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
    }

    static byte[] payload() {
        byte[] v = new byte[recordBytes];
        new Random(29).nextBytes(v);
        return v;
    }

    /** Sends {@code n} records as fast as the producer takes them; waits for every answer. */
    static double prefill(String topic, long n, Produced produced) {
        byte[] v = payload();
        long t0 = System.nanoTime();
        try (KafkaProducer<byte[], byte[]> p = producer()) {
            for (long i = 0; i < n; i++) {
                p.send(new ProducerRecord<>(topic, 0, null, v), (md, e) -> {
                    if (e != null) {
                        produced.failed(e);
                    } else {
                        produced.ok(md.offset());
                    }
                });
            }
            p.flush();
        }
        return (System.nanoTime() - t0) / 1e9;
    }

    static final class RateProducer extends Thread {
        final String topic;
        final Produced produced;
        final long startNs;
        final long endNs;
        long sent;
        long maxBehindNs;
        volatile long finishNs;
        volatile Throwable crash;

        RateProducer(String topic, Produced produced, long startNs, long endNs) {
            super("producer");
            setDaemon(true);
            this.topic = topic;
            this.produced = produced;
            this.startNs = startNs;
            this.endNs = endNs;
        }

        @Override
        public void run() {
            byte[] v = payload();
            double intervalNs = 1e9 / rate;
            try (KafkaProducer<byte[], byte[]> p = producer()) {
                while (true) {
                    long due = startNs + (long) (sent * intervalNs);
                    if (due >= endNs) {
                        break;
                    }
                    long now = System.nanoTime();
                    if (now < due) {
                        LockSupport.parkNanos(due - now);
                        continue;
                    }
                    maxBehindNs = Math.max(maxBehindNs, now - due);
                    try {
                        p.send(new ProducerRecord<>(topic, 0, null, v), (md, e) -> {
                            if (e != null) {
                                produced.failed(e);
                            } else {
                                produced.ok(md.offset());
                            }
                        });
                    } catch (KafkaException e) {
                        produced.failed(e);
                    }
                    sent++;
                }
                finishNs = System.nanoTime();
                p.flush();
            } catch (Throwable e) {
                crash = e;
                exception("producer thread", e);
            }
        }
    }

    static void setupTopicAndGroup(Admin admin, String topic, String group) throws Exception {
        admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get(60, TimeUnit.SECONDS);
        Map<String, String> cfg = new LinkedHashMap<>();
        cfg.put("share.auto.offset.reset", "earliest");
        // KIP-1263: without it a new member waits for its assignment until a later heartbeat.
        cfg.put("share.assignment.interval.ms", "0");
        List<AlterConfigOp> ops = new ArrayList<>();
        cfg.forEach((k, v) -> ops.add(new AlterConfigOp(new ConfigEntry(k, v), AlterConfigOp.OpType.SET)));
        admin.incrementalAlterConfigs(Map.of(new ConfigResource(ConfigResource.Type.GROUP, group), ops))
            .all().get(60, TimeUnit.SECONDS);
    }

    /** Until describeShareGroups shows {@code n} members, each assigned the topic's partition. */
    static double waitJoined(Admin admin, String group, String topic, int n, double timeoutS) {
        long t0 = System.nanoTime();
        String last = "";
        while ((System.nanoTime() - t0) / 1e9 < timeoutS) {
            try {
                ShareGroupDescription d = admin.describeShareGroups(List.of(group)).describedGroups().get(group)
                    .get(10, TimeUnit.SECONDS);
                int assigned = 0;
                for (ShareMemberDescription m : d.members()) {
                    if (m.assignment().topicPartitions().stream().anyMatch(tp -> tp.topic().equals(topic))) {
                        assigned++;
                    }
                }
                last = d.members().size() + " members, " + assigned + " assigned";
                if (assigned >= n) {
                    return (System.nanoTime() - t0) / 1e9;
                }
            } catch (Exception e) {
                last = e.toString();
            }
            sleepMs(200);
        }
        log("not every member joined within " + timeoutS + " s: " + last);
        return -1;
    }

    static void sleepMs(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** (seconds since the consumers started, records acknowledged) every 20 ms. */
    static final class Sampler extends Thread {
        final long t0Ns;
        final List<double[]> samples = Collections.synchronizedList(new ArrayList<>());
        volatile boolean stop;

        Sampler(long t0Ns) {
            super("sampler");
            setDaemon(true);
            this.t0Ns = t0Ns;
        }

        @Override
        public void run() {
            while (!stop) {
                samples.add(new double[] {(System.nanoTime() - t0Ns) / 1e9, ACKED.get()});
                sleepMs(20);
            }
        }

        List<double[]> get() {
            synchronized (samples) {
                return new ArrayList<>(samples);
            }
        }

        /** The acknowledged count at the last sample at or before {@code t}. */
        static double at(List<double[]> s, double t) {
            double v = 0;
            for (double[] x : s) {
                if (x[0] <= t) {
                    v = x[1];
                }
            }
            return v;
        }

        /** Acknowledgements in each whole second since t0. */
        static List<Long> perSecond(List<double[]> s) {
            List<Long> out = new ArrayList<>();
            if (s.isEmpty()) {
                return out;
            }
            double end = s.get(s.size() - 1)[0];
            for (int sec = 0; sec + 1 <= end; sec++) {
                out.add((long) (at(s, sec + 1) - at(s, sec)));
            }
            return out;
        }
    }

    static Map<String, Object> latency(Histogram h) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("count", h.getTotalCount());
        if (h.getTotalCount() > 0) {
            m.put("p50_ms", h.getValueAtPercentile(50) / 1e3);
            m.put("p99_ms", h.getValueAtPercentile(99) / 1e3);
            m.put("p999_ms", h.getValueAtPercentile(99.9) / 1e3);
            m.put("max_ms", h.getMaxValue() / 1e3);
            m.put("mean_ms", h.getMean() / 1e3);
        }
        return m;
    }

    static void waitAllAcked(Produced produced, double deadlineS, long t0Ns) {
        while ((System.nanoTime() - t0Ns) / 1e9 < deadlineS) {
            long target;
            synchronized (produced) {
                target = produced.count;
            }
            if (ACKED.get() >= target) {
                return;
            }
            sleepMs(100);
        }
    }

    public static void main(String[] args) throws Exception {
        for (int i = 0; i + 1 < args.length; i += 2) {
            String v = args[i + 1];
            switch (args[i]) {
                case "--bootstrap" -> bootstrap = v;
                case "--phase" -> phase = v;
                case "--consumers" -> consumers = Integer.parseInt(v);
                case "--record-bytes" -> recordBytes = Integer.parseInt(v);
                case "--prefill" -> prefill = Long.parseLong(v);
                case "--rate" -> rate = Double.parseDouble(v);
                case "--warmup" -> warmupS = Double.parseDouble(v);
                case "--duration" -> durationS = Double.parseDouble(v);
                case "--drain-timeout" -> drainTimeoutS = Double.parseDouble(v);
                case "--max-seconds" -> maxSeconds = Double.parseDouble(v);
                case "--run-id" -> runId = v;
                default -> {
                    System.err.println("unknown option " + args[i]);
                    System.exit(2);
                }
            }
        }
        if (!phase.equals("drain") && !phase.equals("rate")) {
            System.err.println("--phase is drain or rate");
            System.exit(2);
        }
        Thread watchdog = new Thread(() -> {
            sleepMs((long) (maxSeconds * 1000));
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("phase", phase);
            out.put("error", "ShareBench still running after --max-seconds " + maxSeconds + "; stopped");
            out.put("acked", ACKED.get());
            out.put("delivered", DELIVERED.get());
            out.put("exceptions", new TreeMap<>(EXCEPTIONS));
            System.out.println(Json.write(out));
            System.out.flush();
            Runtime.getRuntime().halt(3);
        }, "watchdog");
        watchdog.setDaemon(true);
        watchdog.start();

        String topic = "sharebench-" + phase + "-" + runId;
        String group = "sharebench-" + phase + "-" + runId;
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("phase", phase);
        out.put("bootstrap", bootstrap);
        out.put("topic", topic);
        out.put("group", group);
        out.put("consumers", consumers);
        out.put("record_bytes", recordBytes);
        out.put("acknowledgement", "explicit: acknowledge(record, ACCEPT) per record, commitSync() per poll batch");

        Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        Admin admin = Admin.create(ap);
        setupTopicAndGroup(admin, topic, group);
        Produced produced = new Produced();
        List<Worker> workers = new ArrayList<>();
        for (int i = 0; i < consumers; i++) {
            workers.add(new Worker(i, group, topic));
        }
        Sampler sampler;
        long t0Ns;
        if (phase.equals("drain")) {
            log("prefilling " + prefill + " records of " + recordBytes + " bytes");
            double s = prefill(topic, prefill, produced);
            out.put("prefill_records", produced.count);
            out.put("prefill_seconds", s);
            out.put("prefill_records_per_s", produced.count / s);
            log(String.format(Locale.ROOT, "prefilled %d in %.1f s (%.0f/s); starting %d consumers", produced.count, s,
                produced.count / s, consumers));
            t0Ns = System.nanoTime();
            sampler = new Sampler(t0Ns);
            sampler.start();
            for (Worker w : workers) {
                w.start();
            }
            // The window, in the acknowledgements' own time (the members' join is not the
            // broker's drain rate): from --warmup s after the first acknowledgement or 10 % of
            // the backlog acknowledged, whichever is first, until --duration s later or 90 % of
            // the backlog acknowledged, whichever is first.
            long total = produced.count;
            while (sinceT0(t0Ns) < drainTimeoutS && ACKED.get() < 0.90 * total) {
                double first = firstTime(sampler.get(), 1);
                if (ACKED.get() > 0 && sinceT0(t0Ns) > first + warmupS + durationS + 0.5) {
                    break;
                }
                sleepMs(50);
            }
            sleepMs(100);
            List<double[]> s1 = sampler.get();
            double tFirst = firstTime(s1, 1);
            double wFrom = Math.min(tFirst + warmupS, firstTime(s1, 0.10 * total));
            double wTo = Math.min(wFrom + durationS, firstTime(s1, 0.90 * total));
            String how = wTo - wFrom < durationS - 0.05
                ? "from 10 % to 90 % of the backlog acknowledged"
                : "--duration s after the warm-up";
            double a = Sampler.at(s1, wFrom);
            double b = Sampler.at(s1, wTo);
            Map<String, Object> w = new LinkedHashMap<>();
            w.put("from_s", wFrom);
            w.put("to_s", wTo);
            w.put("seconds", wTo - wFrom);
            w.put("acked", (long) (b - a));
            w.put("acked_per_s", wTo > wFrom ? (b - a) / (wTo - wFrom) : null);
            w.put("window", how);
            out.put("window", w);
            out.put("first_ack_s", tFirst);
            log(String.format(Locale.ROOT, "first acknowledgement %.1f s after the consumers started; window %.1f-%.1f s: %.0f acked/s",
                tFirst, wFrom, wTo, (b - a) / (wTo - wFrom)));
            waitAllAcked(produced, drainTimeoutS, t0Ns);
            double allS = ACKED.get() >= total ? lastChange(sampler.get(), total) : -1;
            out.put("drain_all_seconds", allS >= 0 ? allS : null);
            out.put("drain_all_records_per_s", allS > tFirst ? total / (allS - tFirst) : null);
        } else {
            for (Worker w : workers) {
                w.start();
            }
            double joinS = waitJoined(admin, group, topic, consumers, 90);
            out.put("join_seconds", joinS >= 0 ? joinS : null);
            // Let the members' first empty fetches settle.
            sleepMs(1000);
            long startNs = System.nanoTime() + 200_000_000L;
            long wallStartMs = System.currentTimeMillis() + 200;
            windowFromMs = wallStartMs + (long) (warmupS * 1000);
            windowToMs = wallStartMs + (long) ((warmupS + durationS) * 1000);
            long endNs = startNs + (long) ((warmupS + durationS) * 1e9);
            RateProducer rp = new RateProducer(topic, produced, startNs, endNs);
            t0Ns = startNs;
            sampler = new Sampler(t0Ns);
            sampler.start();
            log(String.format(Locale.ROOT, "%d members assigned after %.1f s; producing %.0f records/s for %.0f s", consumers,
                joinS, rate, warmupS + durationS));
            rp.start();
            rp.join((long) ((warmupS + durationS + 120) * 1000));
            long producedAtEnd;
            synchronized (produced) {
                producedAtEnd = produced.count;
            }
            List<double[]> s1 = sampler.get();
            double a = Sampler.at(s1, warmupS);
            double b = Sampler.at(s1, warmupS + durationS);
            Map<String, Object> w = new LinkedHashMap<>();
            w.put("from_s", warmupS);
            w.put("to_s", warmupS + durationS);
            w.put("seconds", durationS);
            w.put("acked", (long) (b - a));
            w.put("acked_per_s", (b - a) / durationS);
            w.put("window", "records acknowledged between the warm-up's end and the producer's end");
            out.put("window", w);
            out.put("target_rate", rate);
            out.put("sent", rp.sent);
            double producerS = ((rp.finishNs > 0 ? rp.finishNs : System.nanoTime()) - startNs) / 1e9;
            out.put("producer_seconds", producerS);
            out.put("sent_per_s", rp.sent / producerS);
            out.put("producer_max_behind_schedule_ms", rp.maxBehindNs / 1e6);
            out.put("backlog_at_producer_end", producedAtEnd - ACKED.get());
            log(String.format(Locale.ROOT, "window: %.0f acked/s; backlog at the producer's end %d", (b - a) / durationS,
                producedAtEnd - ACKED.get()));
            waitAllAcked(produced, warmupS + durationS + drainTimeoutS, t0Ns);
            long total;
            synchronized (produced) {
                total = produced.count;
            }
            double allS = ACKED.get() >= total ? lastChange(sampler.get(), total) : -1;
            out.put("all_acked_seconds", allS >= 0 ? allS : null);
        }
        // Stop and close the consumers, then account for every offset.
        double stopAt = sinceT0(t0Ns);
        stopConsumers = true;
        for (Worker w : workers) {
            w.join(30_000);
        }
        sampler.stop = true;
        out.put("consumers_stopped_at_s", stopAt);
        summarize(out, workers, produced, sampler);
        admin.close(Duration.ofSeconds(5));
        System.out.println(Json.write(out));
        System.out.flush();
        Runtime.getRuntime().halt(0);
    }

    static double sinceT0(long t0Ns) {
        return (System.nanoTime() - t0Ns) / 1e9;
    }

    static double firstTime(List<double[]> s, double count) {
        for (double[] x : s) {
            if (x[1] >= count) {
                return x[0];
            }
        }
        return s.isEmpty() ? 0 : s.get(s.size() - 1)[0];
    }

    /** The first sample time with at least {@code count} acknowledged. */
    static double lastChange(List<double[]> s, long count) {
        return firstTime(s, count);
    }

    static void summarize(Map<String, Object> out, List<Worker> workers, Produced produced, Sampler sampler) {
        Histogram lat = new Histogram(3_600_000_000L, 3);
        Histogram latAll = new Histogram(3_600_000_000L, 3);
        Histogram commit = new Histogram(3_600_000_000L, 3);
        long redeliveries = 0;
        int maxDc = 0;
        long ackErrBatches = 0;
        long ackErrRecords = 0;
        long polls = 0;
        long empty = 0;
        long batchMax = 0;
        int lockMs = -1;
        int crashed = 0;
        long maxOffset;
        long producedCount;
        BitSet producedOffsets;
        synchronized (produced) {
            maxOffset = produced.maxOffset;
            producedCount = produced.count;
            producedOffsets = (BitSet) produced.offsets.clone();
        }
        int size = (int) Math.max(maxOffset + 1, 1);
        byte[] deliveredTimes = new byte[size];
        byte[] ackedTimes = new byte[size];
        long deliveredOutside = 0;
        List<Long> perConsumerAcked = new ArrayList<>();
        for (Worker w : workers) {
            lat.add(w.latencyUs);
            latAll.add(w.latencyAllUs);
            commit.add(w.commitUs);
            redeliveries += w.redeliveries;
            maxDc = Math.max(maxDc, w.maxDeliveryCount);
            ackErrBatches += w.ackErrorBatches;
            ackErrRecords += w.ackErrorRecords;
            polls += w.polls;
            empty += w.emptyPolls;
            batchMax = Math.max(batchMax, w.batchRecordsMax);
            lockMs = Math.max(lockMs, w.lockTimeoutMs);
            if (w.crash != null || w.isAlive()) {
                crashed++;
            }
            for (int i = 0; i < w.deliveredOffsets.n; i++) {
                long o = w.deliveredOffsets.a[i];
                if (o >= 0 && o < size) {
                    deliveredTimes[(int) o] = (byte) Math.min(100, deliveredTimes[(int) o] + 1);
                } else {
                    deliveredOutside++;
                }
            }
            for (int i = 0; i < w.ackedOffsets.n; i++) {
                long o = w.ackedOffsets.a[i];
                if (o >= 0 && o < size) {
                    ackedTimes[(int) o] = (byte) Math.min(100, ackedTimes[(int) o] + 1);
                }
            }
            perConsumerAcked.add((long) w.ackedOffsets.n);
        }
        long deliveredTwice = 0;
        long ackedTwice = 0;
        long ackedDistinct = 0;
        long missing = 0;
        List<Long> firstMissing = new ArrayList<>();
        for (int o = 0; o < size; o++) {
            if (deliveredTimes[o] > 1) {
                deliveredTwice++;
            }
            if (ackedTimes[o] > 1) {
                ackedTwice++;
            }
            if (ackedTimes[o] > 0) {
                ackedDistinct++;
            }
            if (producedOffsets.get(o) && ackedTimes[o] == 0) {
                missing++;
                if (firstMissing.size() < 10) {
                    firstMissing.add((long) o);
                }
            }
        }
        out.put("produced", producedCount);
        out.put("produce_errors", produced.errors);
        out.put("produced_offsets_contiguous", producedOffsets.cardinality() == producedCount
            && producedOffsets.nextClearBit(0) == producedCount);
        out.put("delivered", DELIVERED.get());
        out.put("acked", ACKED.get());
        out.put("acked_distinct_offsets", ackedDistinct);
        out.put("deliveries_with_delivery_count_over_1", redeliveries);
        out.put("max_delivery_count", maxDc);
        out.put("offsets_delivered_more_than_once", deliveredTwice);
        out.put("offsets_acked_more_than_once", ackedTwice);
        out.put("delivered_outside_produced_range", deliveredOutside);
        out.put("ack_error_batches", ackErrBatches);
        out.put("ack_error_records", ackErrRecords);
        out.put("produced_never_acked", missing);
        out.put("first_never_acked_offsets", firstMissing);
        out.put("complete", missing == 0 && producedCount > 0 && produced.errors == 0);
        out.put("latency_window", latency(lat));
        out.put("latency_all", latency(latAll));
        out.put("commit_sync", latency(commit));
        out.put("polls", polls);
        out.put("empty_polls", empty);
        out.put("largest_poll_batch", batchMax);
        out.put("records_per_nonempty_poll", polls - empty > 0 ? (double) DELIVERED.get() / (polls - empty) : null);
        out.put("acquisition_lock_timeout_ms", lockMs);
        out.put("consumers_crashed_or_stuck", crashed);
        out.put("acked_per_consumer", perConsumerAcked);
        out.put("acked_per_second", Sampler.perSecond(sampler.get()));
        out.put("exceptions", new TreeMap<>(EXCEPTIONS));
    }

    /** Just enough JSON for the result line: maps, lists, strings, numbers, booleans, null. */
    static final class Json {
        static String write(Object o) {
            StringBuilder b = new StringBuilder();
            write(b, o);
            return b.toString();
        }

        static void write(StringBuilder b, Object o) {
            if (o == null) {
                b.append("null");
            } else if (o instanceof Map<?, ?> m) {
                b.append('{');
                boolean first = true;
                for (Map.Entry<?, ?> e : m.entrySet()) {
                    if (!first) {
                        b.append(',');
                    }
                    first = false;
                    string(b, String.valueOf(e.getKey()));
                    b.append(':');
                    write(b, e.getValue());
                }
                b.append('}');
            } else if (o instanceof List<?> l) {
                b.append('[');
                for (int i = 0; i < l.size(); i++) {
                    if (i > 0) {
                        b.append(',');
                    }
                    write(b, l.get(i));
                }
                b.append(']');
            } else if (o instanceof Double d) {
                b.append(d.isNaN() || d.isInfinite() ? "null"
                    : new java.math.BigDecimal(d).round(new java.math.MathContext(7)).stripTrailingZeros().toPlainString());
            } else if (o instanceof Number || o instanceof Boolean) {
                b.append(o);
            } else {
                string(b, o.toString());
            }
        }

        static void string(StringBuilder b, String s) {
            b.append('"');
            for (char c : s.toCharArray()) {
                switch (c) {
                    case '"' -> b.append("\\\"");
                    case '\\' -> b.append("\\\\");
                    case '\n' -> b.append("\\n");
                    case '\r' -> b.append("\\r");
                    case '\t' -> b.append("\\t");
                    default -> {
                        if (c < 0x20) {
                            b.append(String.format(Locale.ROOT, "\\u%04x", (int) c));
                        } else {
                            b.append(c);
                        }
                    }
                }
            }
            b.append('"');
        }
    }
}
