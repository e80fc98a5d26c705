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
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * One exactly-once consume-transform-produce application, run as its own JVM by {@link TxnTest}
 * so that it can be killed with SIGKILL and restarted. A {@code KafkaConsumer} in a group
 * ({@code isolation.level=read_committed}, no auto-commit) reads the input topic; for each poll
 * batch a {@code KafkaProducer} with a {@code transactional.id} begins a transaction, sends one
 * output record per input record, adds the consumed offsets with
 * {@code sendOffsetsToTransaction(offsets, consumer.groupMetadata())} and commits. Every
 * {@code ABORT_EVERY}-th transaction is aborted on purpose after its records were flushed to the
 * broker, so that the output topic always holds aborted records; the batch is then processed
 * again in a later transaction.
 *
 * <p>Errors are handled as the {@code KafkaProducer} documentation prescribes: a fatal one
 * ({@code ProducerFencedException}, {@code OutOfOrderSequenceException},
 * {@code AuthorizationException}, {@code UnsupportedVersionException}) ends the application
 * (exit status 5); any other {@code KafkaException} aborts the transaction, and the consumer goes
 * back to where the batch started. A {@code TimeoutException} from {@code commitTransaction} or
 * {@code abortTransaction} is retried, as the documentation allows, a few times; then, and on an
 * {@code IllegalStateException} (a state the producer should never be in), the application ends
 * too.
 *
 * <p>Input records are keyed, with values {@code in|ID}; each output record has the input's key
 * and the value {@code out|ID|PARTITION|OFFSET|NAME|TXN}: the input record's id, partition and
 * offset, this application's NAME and the number of the transaction within this process (1, 2,
 * ...), so that the test can tell which transaction wrote it. One line per event goes to the log
 * file, each with one write(2) so that a SIGKILL loses at most the line being written:
 *
 * <pre>
 * NANOS started PID TRANSACTIONAL_ID
 * NANOS initialized                    (initTransactions returned)
 * NANOS assign P,P,... GEN             (onPartitionsAssigned; GEN: groupMetadata().generationId())
 * NANOS revoke P,P,...
 * NANOS lost P,P,...
 * NANOS begin TXN COUNT P:FIRST-LAST,...   (a poll batch: COUNT records, per partition its offsets)
 * NANOS committing TXN P:NEXT,...      (the records are sent and the offsets added)
 * NANOS committed TXN COUNT
 * NANOS aborting TXN COUNT on-purpose  (the records were flushed first)
 * NANOS aborting TXN COUNT error EXCEPTION MESSAGE
 * NANOS aborted TXN COUNT
 * NANOS fatal TXN EXCEPTION MESSAGE    (then the process exits with status 5)
 * NANOS stopping
 * NANOS closed
 * </pre>
 *
 * <p>Usage: {@code sluice.TxnApp BOOTSTRAP GROUP IN_TOPIC OUT_TOPIC NAME TRANSACTIONAL_ID LOG STOP
 * ABORT_EVERY [CONFIG=VALUE ...]}; a CONFIG whose name starts with {@code producer.} goes to the
 * producer without that prefix, {@code app.min.txn.ms} paces the application (a transaction begins
 * at least that long after the previous one began, so that the input lasts while the test kills
 * its applications), any other goes to the consumer. The application closes when the file
 * STOP exists, and exits by itself if the process that started it is gone or after ten minutes.
 */
public final class TxnApp {
    static final long MAX_LIFE_MS = 600_000;
    /** How often a timed-out initTransactions, commitTransaction or abortTransaction is tried. */
    static final int END_TXN_TRIES = 5;
    static final int EXIT_FATAL = 5;

    private final FileOutputStream log;
    private final String outTopic;
    private final String name;
    private KafkaConsumer<String, String> consumer;
    private KafkaProducer<String, String> producer;

    private TxnApp(FileOutputStream log, String outTopic, String name) {
        this.log = log;
        this.outTopic = outTopic;
        this.name = name;
    }

    // ---------------------------------------------------------------- records

    static String inputValue(long id) {
        return "in|" + id;
    }

    static long idOf(String inputValue) {
        if (inputValue == null || !inputValue.startsWith("in|")) {
            return -1;
        }
        try {
            return Long.parseLong(inputValue.substring(3));
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    static String outputValue(long id, int partition, long offset, String name, long txn) {
        return "out|" + id + "|" + partition + "|" + offset + "|" + name + "|" + txn;
    }

    // ---------------------------------------------------------------- the log

    private synchronized void emit(String line) {
        byte[] b = (System.nanoTime() + " " + line + "\n").getBytes(StandardCharsets.UTF_8);
        try {
            log.write(b);
        } catch (IOException e) {
            throw new RuntimeException("cannot write the application log", e);
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

    static String oneLine(Throwable e) {
        return e.getClass().getSimpleName() + " " + String.valueOf(e.getMessage()).replace('\n', ' ');
    }

    private final ConsumerRebalanceListener listener = new ConsumerRebalanceListener() {
        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> tps) {
            emit("assign " + parts(tps) + " " + consumer.groupMetadata().generationId());
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> tps) {
            // Nothing to commit here: a transaction never stays open across poll().
            if (!tps.isEmpty()) {
                emit("revoke " + parts(tps));
            }
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> tps) {
            emit("lost " + parts(tps));
        }
    };

    // ---------------------------------------------------------------- the application

    public static void main(String[] args) throws Exception {
        if (args.length < 9) {
            System.err.println("usage: sluice.TxnApp BOOTSTRAP GROUP IN_TOPIC OUT_TOPIC NAME TRANSACTIONAL_ID LOG STOP"
                + " ABORT_EVERY [CONFIG=VALUE ...]");
            System.exit(2);
        }
        // Never outlive the test that started this application, nor run forever.
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

        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, args[1]);
        c.put(ConsumerConfig.CLIENT_ID_CONFIG, args[4]);
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, args[4] + "-producer");
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, args[5]);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        for (int i = 9; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            String key = args[i].substring(0, eq);
            String value = args[i].substring(eq + 1);
            if (key.startsWith("producer.")) {
                p.put(key.substring("producer.".length()), value);
            } else {
                c.put(key, value);
            }
        }
        long minTxnMs = Long.parseLong(c.getProperty("app.min.txn.ms", "0"));
        c.remove("app.min.txn.ms");
        Path stop = Path.of(args[7]);
        int abortEvery = Integer.parseInt(args[8]);
        int status;
        try (FileOutputStream log = new FileOutputStream(args[6], true)) {
            TxnApp app = new TxnApp(log, args[3], args[4]);
            status = app.run(c, p, args[2], args[5], stop, abortEvery, minTxnMs);
        }
        System.exit(status);
    }

    /** The transaction could not be ended: the producer can only be closed. */
    static final class Stuck extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Stuck(String why, Throwable cause) {
            super(why, cause);
        }
    }

    /**
     * Ends the current transaction, trying again after a TimeoutException: Kafka allows that, but
     * no other operation, since the first attempt may already be completing; after
     * {@link #END_TXN_TRIES} the producer can only be closed.
     */
    private void endTransaction(boolean commit) {
        for (int attempt = 1; ; attempt++) {
            try {
                if (commit) {
                    producer.commitTransaction();
                } else {
                    producer.abortTransaction();
                }
                return;
            } catch (TimeoutException e) {
                if (attempt >= END_TXN_TRIES) {
                    throw new Stuck((commit ? "commitTransaction" : "abortTransaction") + " timed out " + attempt
                        + " times", e);
                }
                emit("retrying " + (commit ? "commit" : "abort") + " " + oneLine(e));
            }
        }
    }

    private int run(Properties consumerConfig, Properties producerConfig, String inTopic, String transactionalId,
                    Path stop, int abortEvery, long minTxnMs) {
        emit("started " + ProcessHandle.current().pid() + " " + transactionalId);
        producer = new KafkaProducer<>(producerConfig);
        long txn = 0;
        long lastBegin = System.nanoTime() - TimeUnit.MILLISECONDS.toNanos(minTxnMs);
        try {
            // Fences every earlier producer with this transactional id, and aborts (or completes)
            // what it left open. Kafka allows retrying it after a TimeoutException (a broker that
            // is restarting).
            for (int attempt = 1; ; attempt++) {
                try {
                    producer.initTransactions();
                    break;
                } catch (TimeoutException e) {
                    if (attempt >= END_TXN_TRIES) {
                        throw new Stuck("initTransactions timed out " + attempt + " times", e);
                    }
                    emit("retrying init " + oneLine(e));
                }
            }
            emit("initialized");
            consumer = new KafkaConsumer<>(consumerConfig);
            consumer.subscribe(List.of(inTopic), listener);
            while (!Files.exists(stop)) {
                long pause = lastBegin + TimeUnit.MILLISECONDS.toNanos(minTxnMs) - System.nanoTime();
                if (pause > 0) {
                    LockSupport.parkNanos(pause);
                }
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    continue;
                }
                lastBegin = System.nanoTime();
                txn++;
                Map<TopicPartition, Long> first = new TreeMap<>((a, b) -> Integer.compare(a.partition(), b.partition()));
                Map<TopicPartition, Long> last = new HashMap<>();
                for (ConsumerRecord<String, String> r : records) {
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    first.putIfAbsent(tp, r.offset());
                    last.put(tp, r.offset());
                }
                StringBuilder ranges = new StringBuilder();
                StringBuilder nexts = new StringBuilder();
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (var e : first.entrySet()) {
                    long end = last.get(e.getKey());
                    offsets.put(e.getKey(), new OffsetAndMetadata(end + 1));
                    ranges.append(ranges.length() > 0 ? "," : "").append(e.getKey().partition()).append(':')
                        .append(e.getValue()).append('-').append(end);
                    nexts.append(nexts.length() > 0 ? "," : "").append(e.getKey().partition()).append(':').append(end + 1);
                }
                int count = records.count();
                boolean onPurpose = abortEvery > 0 && txn % abortEvery == 0;
                try {
                    producer.beginTransaction();
                    emit("begin " + txn + " " + count + " " + ranges);
                    for (ConsumerRecord<String, String> r : records) {
                        producer.send(new ProducerRecord<>(outTopic, r.key(),
                            outputValue(idOf(r.value()), r.partition(), r.offset(), name, txn)));
                    }
                    if (onPurpose) {
                        // Flushed first, so that the aborted records are in the log for
                        // read_uncommitted consumers to see.
                        producer.flush();
                        emit("aborting " + txn + " " + count + " on-purpose");
                        endTransaction(false);
                        emit("aborted " + txn + " " + count);
                        rewind(first);
                        continue;
                    }
                    producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                    emit("committing " + txn + " " + nexts);
                    endTransaction(true);
                    emit("committed " + txn + " " + count);
                } catch (ProducerFencedException | OutOfOrderSequenceException | AuthorizationException
                         | UnsupportedVersionException | Stuck e) {
                    emit("fatal " + txn + " " + oneLine(e));
                    return EXIT_FATAL;
                } catch (KafkaException e) {
                    emit("aborting " + txn + " " + count + " error " + oneLine(e));
                    try {
                        endTransaction(false);
                    } catch (KafkaException e2) {
                        emit("fatal " + txn + " " + oneLine(e2));
                        return EXIT_FATAL;
                    }
                    emit("aborted " + txn + " " + count);
                    rewind(first);
                }
            }
        } catch (ProducerFencedException | OutOfOrderSequenceException | AuthorizationException
                 | UnsupportedVersionException | Stuck | IllegalStateException e) {
            emit("fatal " + txn + " " + oneLine(e));
            return EXIT_FATAL;
        }
        emit("stopping");
        consumer.close(CloseOptions.timeout(Duration.ofSeconds(20)));
        producer.close(Duration.ofSeconds(20));
        emit("closed");
        return 0;
    }

    /** Back to where the batch of an aborted transaction started, to process it again. */
    private void rewind(Map<TopicPartition, Long> first) {
        for (var e : first.entrySet()) {
            consumer.seek(e.getKey(), e.getValue());
        }
    }
}
