package sluice;

import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.TreeSet;

import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * One consumer-group member, run as its own JVM by {@link GroupTest} so that it can be killed with
 * SIGKILL. It subscribes to one topic, polls, checks each record's key and value against its
 * sequence number, commits (commitSync) the next offset of each partition after every poll batch,
 * and appends one line per event to a log file, written with one write(2) each so that a SIGKILL
 * loses at most the line being written:
 *
 * <pre>
 * NANOS started PID
 * NANOS assign P,P,... GEN        (onPartitionsAssigned, "-" for none; GEN: groupMetadata().generationId())
 * NANOS revoke P,P,...            (at the end of onPartitionsRevoked, after its commit)
 * NANOS lost P,P,...              (onPartitionsLost)
 * NANOS consumed P:O:SEQ ...      (one poll batch, in order)
 * NANOS damaged P:O KEY VALUE     (a record that is not what the producer sent for its sequence)
 * NANOS committing WHERE P:O,...  (WHERE: batch or revoke)
 * NANOS committed WHERE P:O,...
 * NANOS commit_failed WHERE P:O,... EXCEPTION MESSAGE
 * NANOS stopping P,P,...          (the assignment when the stop file appeared)
 * NANOS closed
 * </pre>
 *
 * NANOS is System.nanoTime(), CLOCK_MONOTONIC on Linux, which every process on the machine shares.
 *
 * <p>Usage: {@code sluice.GroupMember BOOTSTRAP GROUP TOPIC NAME LOG STOP COMMIT_DELAY_MS
 * REVOKE_COMMIT [CONFIG=VALUE ...]}. REVOKE_COMMIT is {@code pending} (the revoke callback commits
 * what was processed but not committed yet) or {@code always} (it commits the processed positions
 * of the revoked partitions in any case). The member closes when the file STOP exists, and exits
 * by itself if the process that started it is gone or after ten minutes.
 */
public final class GroupMember {
    static final int KEYS = 997;
    static final long MAX_LIFE_MS = 600_000;

    private final FileOutputStream log;
    private final String topic;
    private final String revokeCommit;
    private KafkaConsumer<String, String> consumer;
    /** Partition -> next offset after the last record processed, and last committed. */
    private final Map<Integer, Long> processed = new HashMap<>();
    private final Map<Integer, Long> committed = new HashMap<>();

    private GroupMember(FileOutputStream log, String topic, String revokeCommit) {
        this.log = log;
        this.topic = topic;
        this.revokeCommit = revokeCommit;
    }

    // ---------------------------------------------------------------- what the producer sends

    static String keyOf(long seq) {
        return String.format("k%03d", (seq * 7919) % KEYS);
    }

    static String valueOf(long seq) {
        long h = seq * 0x9E3779B97F4A7C15L;
        h ^= h >>> 29;
        h *= 0xBF58476D1CE4E5B9L;
        h ^= h >>> 32;
        return seq + "|" + Long.toHexString(h) + "|groups";
    }

    static long seqOf(String value) {
        int bar = value == null ? -1 : value.indexOf('|');
        if (bar <= 0) {
            return -1;
        }
        try {
            return Long.parseLong(value.substring(0, bar));
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    // ---------------------------------------------------------------- the log

    private synchronized void emit(String line) {
        byte[] b = (System.nanoTime() + " " + line + "\n").getBytes(StandardCharsets.UTF_8);
        try {
            log.write(b);
        } catch (IOException e) {
            throw new RuntimeException("cannot write the member log", e);
        }
    }

    static String parts(Collection<TopicPartition> tps) {
        TreeSet<Integer> ps = new TreeSet<>();
        for (TopicPartition tp : tps) {
            ps.add(tp.partition());
        }
        if (ps.isEmpty()) {
            return "-";
        }
        StringBuilder sb = new StringBuilder();
        for (int p : ps) {
            if (sb.length() > 0) {
                sb.append(',');
            }
            sb.append(p);
        }
        return sb.toString();
    }

    static String offsets(Map<Integer, Long> offsets) {
        if (offsets.isEmpty()) {
            return "-";
        }
        StringBuilder sb = new StringBuilder();
        for (var e : new TreeMap<>(offsets).entrySet()) {
            if (sb.length() > 0) {
                sb.append(',');
            }
            sb.append(e.getKey()).append(':').append(e.getValue());
        }
        return sb.toString();
    }

    // ---------------------------------------------------------------- committing

    private void commit(Map<Integer, Long> offsets, String where) {
        if (offsets.isEmpty()) {
            return;
        }
        Map<TopicPartition, OffsetAndMetadata> request = new HashMap<>();
        offsets.forEach((p, o) -> request.put(new TopicPartition(topic, p), new OffsetAndMetadata(o)));
        String what = offsets(offsets);
        emit("committing " + where + " " + what);
        try {
            consumer.commitSync(request, Duration.ofSeconds(15));
        } catch (KafkaException e) {
            String msg = String.valueOf(e.getMessage()).replace('\n', ' ');
            emit("commit_failed " + where + " " + what + " " + e.getClass().getSimpleName() + " " + msg);
            return;
        }
        offsets.forEach((p, o) -> committed.merge(p, o, Math::max));
        emit("committed " + where + " " + what);
    }

    private final ConsumerRebalanceListener listener = new ConsumerRebalanceListener() {
        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> tps) {
            // The generation (classic) or member epoch (KIP-848) this assignment belongs to; -1
            // while the client knows none.
            emit("assign " + parts(tps) + " " + consumer.groupMetadata().generationId());
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> tps) {
            if (tps.isEmpty()) {
                return;
            }
            Map<Integer, Long> pending = new TreeMap<>();
            for (TopicPartition tp : tps) {
                Long done = processed.get(tp.partition());
                if (done == null) {
                    continue;
                }
                if (revokeCommit.equals("always") || done > committed.getOrDefault(tp.partition(), -1L)) {
                    pending.put(tp.partition(), done);
                }
            }
            commit(pending, "revoke");
            for (TopicPartition tp : tps) {
                processed.remove(tp.partition());
                committed.remove(tp.partition());
            }
            emit("revoke " + parts(tps));
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> tps) {
            for (TopicPartition tp : tps) {
                processed.remove(tp.partition());
                committed.remove(tp.partition());
            }
            emit("lost " + parts(tps));
        }
    };

    // ---------------------------------------------------------------- the member

    public static void main(String[] args) throws Exception {
        if (args.length < 8) {
            System.err.println("usage: sluice.GroupMember BOOTSTRAP GROUP TOPIC NAME LOG STOP COMMIT_DELAY_MS"
                + " REVOKE_COMMIT [CONFIG=VALUE ...]");
            System.exit(2);
        }
        // Never outlive the test that started this member, nor run forever.
        long started = System.currentTimeMillis();
        ProcessHandle parent = ProcessHandle.current().parent().orElse(null);
        Thread watchdog = new Thread(() -> {
            while (true) {
                if ((parent != null && !parent.isAlive()) || System.currentTimeMillis() - started > MAX_LIFE_MS) {
                    Runtime.getRuntime().halt(3);
                }
                try {
                    Thread.sleep(500);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "watchdog");
        watchdog.setDaemon(true);
        watchdog.start();

        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, args[1]);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, args[3]);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        for (int i = 8; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            p.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        Path stop = Path.of(args[5]);
        long commitDelayMs = Long.parseLong(args[6]);
        try (FileOutputStream log = new FileOutputStream(args[4], true)) {
            GroupMember m = new GroupMember(log, args[2], args[7]);
            m.run(p, stop, commitDelayMs);
        }
        System.exit(0);
    }

    private void run(Properties config, Path stop, long commitDelayMs) throws InterruptedException {
        consumer = new KafkaConsumer<>(config);
        consumer.subscribe(List.of(topic), listener);
        emit("started " + ProcessHandle.current().pid());
        while (!Files.exists(stop)) {
            ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
            if (records.isEmpty()) {
                continue;
            }
            StringBuilder line = new StringBuilder("consumed");
            Map<Integer, Long> batch = new TreeMap<>();
            for (ConsumerRecord<String, String> r : records) {
                long seq = seqOf(r.value());
                if (seq < 0 || !keyOf(seq).equals(r.key()) || !valueOf(seq).equals(r.value())) {
                    emit("damaged " + r.partition() + ":" + r.offset() + " " + r.key() + " " + r.value());
                }
                line.append(' ').append(r.partition()).append(':').append(r.offset()).append(':').append(seq);
                batch.put(r.partition(), r.offset() + 1);
            }
            emit(line.toString());
            processed.putAll(batch);
            if (commitDelayMs > 0) {
                Thread.sleep(commitDelayMs);
            }
            commit(batch, "batch");
        }
        emit("stopping " + parts(consumer.assignment()));
        consumer.close(CloseOptions.timeout(Duration.ofSeconds(20)));
        emit("closed");
    }
}
