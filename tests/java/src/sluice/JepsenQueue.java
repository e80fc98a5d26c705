package sluice;

import java.io.BufferedWriter;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.util.Collection;
import java.util.List;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The Java client's side of the Jepsen-style queue workload (tests/python/jepsen.py): one
 * idempotent acks=all producer and one consumer-group member (subscribed, committing after every
 * poll) in one JVM, started with Java's source launcher. It runs until its stdin closes, then
 * flushes the producer, closes both and exits. Every event is one line on stdout:
 *
 * <pre>
 * P session S                  (a new producer instance; S counts from 0)
 * P ack S N PARTITION OFFSET   (value jNAME-N acknowledged; what is sent is its payload, padded)
 * P fail S N ERROR             (value jNAME-N not acknowledged: it may or may not be in the log)
 * C assign P,P,...             (onPartitionsAssigned, "-" for none)
 * C revoke P,P,...             (onPartitionsRevoked)
 * C lost P,P,...               (onPartitionsLost)
 * C poll P:OFFSET:PAYLOAD ...  (one poll's records, in the order returned)
 * C commit_failed ERROR
 * attempted N                  (values jNAME-0 .. jNAME-(N-1) were sent)
 * done
 * </pre>
 *
 * <p>Usage: {@code java -cp 'target/java-deps/*' JepsenQueue.java BOOTSTRAP TOPIC GROUP NAME
 * RATE}, RATE in messages per second. It exits by itself if the process that started it is gone.
 */
public final class JepsenQueue {
    /** How long a send may take before its callback reports a failure: the client's default. */
    static final int DELIVERY_TIMEOUT_MS = 120_000;
    static final int REQUEST_TIMEOUT_MS = 5_000;
    /** How long the final flush and each close may take. */
    static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(30);
    /** Bytes after each value, as jepsen.py's PAD_BYTES. */
    static final int PAD_BYTES = 256;

    private final BufferedWriter out = new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8));
    private final AtomicBoolean stopping = new AtomicBoolean();
    private final String bootstrap;
    private final String topic;
    private final String group;
    private final String name;
    private final int rate;

    private JepsenQueue(String[] args) {
        bootstrap = args[0];
        topic = args[1];
        group = args[2];
        name = args[3];
        rate = Integer.parseInt(args[4]);
    }

    private void emit(String line) {
        synchronized (out) {
            try {
                out.write(line);
                out.write('\n');
                out.flush();
            } catch (IOException e) {
                // The harness is gone: nothing left to report to.
                Runtime.getRuntime().halt(4);
            }
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

    /**
     * What is sent for {@code value}: the value, {@code |}, then PAD_BYTES that depend only on it
     * (the hex of its SHA-256, repeated), as jepsen.py's {@code payload}.
     */
    static String payload(String value) {
        byte[] digest;
        try {
            digest = MessageDigest.getInstance("SHA-256").digest(value.getBytes(StandardCharsets.UTF_8));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
        StringBuilder hex = new StringBuilder();
        for (byte b : digest) {
            hex.append(String.format("%02x", b));
        }
        StringBuilder out = new StringBuilder(value).append('|');
        while (out.length() < value.length() + 1 + PAD_BYTES) {
            out.append(hex);
        }
        out.setLength(value.length() + 1 + PAD_BYTES);
        return out.toString();
    }

    static String describe(Exception e) {
        return e.getClass().getSimpleName();
    }

    /** Errors after which this producer instance sends nothing more: a new one takes over. */
    static boolean fatal(Exception e) {
        return e instanceof OutOfOrderSequenceException || e instanceof ProducerFencedException
            || e instanceof AuthorizationException || e instanceof UnsupportedVersionException;
    }

    // ---------------------------------------------------------------- the producer

    private KafkaProducer<String, String> newProducer() {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, name + "-producer");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, Integer.toString(DELIVERY_TIMEOUT_MS));
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, Integer.toString(REQUEST_TIMEOUT_MS));
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return new KafkaProducer<>(p);
    }

    private long produce() throws InterruptedException {
        long attempted = 0;
        int session = 0;
        long intervalNanos = 1_000_000_000L / Math.max(rate, 1);
        long next = System.nanoTime();
        while (!stopping.get()) {
            final int s = session;
            emit("P session " + s);
            AtomicBoolean broken = new AtomicBoolean();
            KafkaProducer<String, String> producer = newProducer();
            try {
                while (!stopping.get() && !broken.get()) {
                    final long n = attempted++;
                    try {
                        producer.send(new ProducerRecord<>(topic, null, payload("j" + name + "-" + n)), (meta, error) -> {
                            if (error != null) {
                                emit("P fail " + s + " " + n + " " + describe(error));
                                if (fatal(error)) {
                                    broken.set(true);
                                }
                            } else {
                                emit("P ack " + s + " " + n + " " + meta.partition() + " " + meta.offset());
                            }
                        });
                    } catch (KafkaException e) {
                        // Refused before it was sent (a fatal state of this instance).
                        emit("P fail " + s + " " + n + " " + describe(e));
                        broken.set(true);
                    }
                    next += intervalNanos;
                    long wait = next - System.nanoTime();
                    if (wait > 0) {
                        Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                    } else {
                        next = System.nanoTime();
                    }
                }
                try {
                    producer.flush();
                } catch (KafkaException e) {
                    // The callbacks report each send's outcome.
                }
            } finally {
                producer.close(CLOSE_TIMEOUT);
            }
            session++;
        }
        return attempted;
    }

    // ---------------------------------------------------------------- the consumer

    private void consume() {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, name + "-consumer");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
        p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
        p.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, Integer.toString(REQUEST_TIMEOUT_MS));
        // The assignor librdkafka's members of the same group also name.
        p.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, RangeAssignor.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(p)) {
            consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> tps) {
                    emit("C assign " + parts(tps));
                }

                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> tps) {
                    emit("C revoke " + parts(tps));
                }

                @Override
                public void onPartitionsLost(Collection<TopicPartition> tps) {
                    emit("C lost " + parts(tps));
                }
            });
            while (!stopping.get()) {
                ConsumerRecords<String, String> records;
                try {
                    records = consumer.poll(Duration.ofMillis(200));
                } catch (KafkaException e) {
                    emit("C poll_failed " + describe(e));
                    continue;
                }
                if (records.isEmpty()) {
                    continue;
                }
                StringBuilder line = new StringBuilder("C poll");
                for (ConsumerRecord<String, String> r : records) {
                    line.append(' ').append(r.partition()).append(':').append(r.offset()).append(':').append(r.value());
                }
                emit(line.toString());
                try {
                    consumer.commitSync(Duration.ofSeconds(5));
                } catch (KafkaException e) {
                    emit("C commit_failed " + describe(e));
                }
            }
            consumer.close(CloseOptions.timeout(CLOSE_TIMEOUT));
        }
    }

    // ---------------------------------------------------------------- the process

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: sluice.JepsenQueue BOOTSTRAP TOPIC GROUP NAME RATE");
            System.exit(2);
        }
        JepsenQueue q = new JepsenQueue(args);
        ProcessHandle parent = ProcessHandle.current().parent().orElse(null);
        Thread watchdog = new Thread(() -> {
            while (true) {
                if (parent != null && !parent.isAlive()) {
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
        // Stdin closing is the signal to stop.
        Thread stdin = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                    // Nothing is sent on stdin; it only closes.
                }
            } catch (IOException e) {
                // Closed either way.
            }
            q.stopping.set(true);
        }, "stdin");
        stdin.setDaemon(true);
        stdin.start();

        AtomicLong attempted = new AtomicLong();
        Thread consumer = new Thread(q::consume, "consumer");
        consumer.start();
        attempted.set(q.produce());
        consumer.join();
        q.emit("attempted " + attempted.get());
        q.emit("done");
        System.exit(0);
    }
}
