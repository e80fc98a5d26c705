package sluice;

import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * One share-group member (KIP-932, {@link KafkaShareConsumer}) run as its own JVM by
 * {@link ShareTest} so that it can be killed with SIGKILL while it holds acquired records. It
 * subscribes to one topic, polls until a poll returns records, logs them, and then holds them:
 * it never acknowledges them and never polls again (its heartbeat thread keeps it in the group and
 * its connection open) until it is killed. One line per event, each written with one write(2) so
 * that a SIGKILL loses at most the line being written:
 *
 * <pre>
 * NANOS started PID
 * NANOS received LOCK_MS P:O:DC:VALUE ...   (the first non-empty poll; LOCK_MS is
 *                                            acquisitionLockTimeoutMs(), -1 when unknown;
 *                                            DC is deliveryCount(), -1 when absent)
 * NANOS holding                              (nothing acknowledged; waiting to be killed)
 * NANOS failed EXCEPTION MESSAGE
 * </pre>
 *
 * NANOS is System.nanoTime(), CLOCK_MONOTONIC on Linux, which every process on the machine shares.
 *
 * <p>Usage: {@code sluice.ShareMember BOOTSTRAP GROUP TOPIC NAME LOG [CONFIG=VALUE ...]}. It exits
 * by itself when the process that started it is gone, and after two minutes.
 */
public final class ShareMember {
    static final long MAX_LIFE_MS = 120_000;

    private final FileOutputStream log;

    private ShareMember(FileOutputStream log) {
        this.log = log;
    }

    private synchronized void emit(String line) {
        byte[] b = (System.nanoTime() + " " + line + "\n").getBytes(StandardCharsets.UTF_8);
        try {
            log.write(b);
        } catch (IOException e) {
            throw new RuntimeException("cannot write the member log", e);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 5) {
            System.err.println("usage: sluice.ShareMember BOOTSTRAP GROUP TOPIC NAME LOG [CONFIG=VALUE ...]");
            System.exit(2);
        }
        long started = System.currentTimeMillis();
        ProcessHandle parent = ProcessHandle.current().parent().orElse(null);
        Thread watchdog = new Thread(() -> {
            while (true) {
                if ((parent != null && !parent.isAlive()) || System.currentTimeMillis() - started > MAX_LIFE_MS) {
                    Runtime.getRuntime().halt(3);
                }
                try {
                    Thread.sleep(300);
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
        for (int i = 5; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            p.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        try (FileOutputStream out = new FileOutputStream(args[4], true)) {
            new ShareMember(out).run(p, args[2]);
        }
        System.exit(0);
    }

    private void run(Properties config, String topic) throws InterruptedException {
        emit("started " + ProcessHandle.current().pid());
        // Not closed: closing would acknowledge what it holds, and it is meant to be killed.
        KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(config);
        try {
            consumer.subscribe(List.of(topic));
            while (true) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(100));
                if (records.isEmpty()) {
                    continue;
                }
                StringBuilder line = new StringBuilder("received ").append(consumer.acquisitionLockTimeoutMs().orElse(-1));
                for (ConsumerRecord<String, String> r : records) {
                    line.append(' ').append(r.partition()).append(':').append(r.offset()).append(':')
                        .append(r.deliveryCount().map(Short::intValue).orElse(-1)).append(':').append(r.value());
                }
                emit(line.toString());
                break;
            }
            emit("holding");
        } catch (RuntimeException e) {
            emit("failed " + e.getClass().getSimpleName() + " " + String.valueOf(e.getMessage()).replace('\n', ' '));
            System.exit(1);
        }
        while (true) {
            Thread.sleep(1_000);
        }
    }
}
