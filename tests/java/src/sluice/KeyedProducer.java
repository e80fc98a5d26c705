package sluice;

import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The Java client's idempotent acks=all producer, for the Python cluster tests that kill brokers
 * under it (tests/python/test_replication.py): sends {@code count} keyed messages whose values
 * are their numbers from {@code start}, and prints one line per outcome to stdout,
 * {@code ack VALUE PARTITION OFFSET} or {@code fail VALUE ERROR}, then {@code done}. Run with
 * the source launcher: {@code java -cp 'target/java-deps/*' KeyedProducer.java BOOTSTRAP TOPIC
 * START COUNT COMPRESSION}.
 */
public final class KeyedProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        long start = Long.parseLong(args[2]);
        long count = Long.parseLong(args[3]);
        String compression = args.length > 4 ? args[4] : "none";
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, compression);
        props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "120000");
        props.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        AtomicLong failed = new AtomicLong();
        StringBuilder out = new StringBuilder();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            for (long i = start; i < start + count; i++) {
                final long value = i;
                producer.send(new ProducerRecord<>(topic, "k" + (i % 101), Long.toString(i)), (meta, error) -> {
                    synchronized (out) {
                        if (error != null) {
                            failed.incrementAndGet();
                            out.append("fail ").append(value).append(' ').append(error).append('\n');
                        } else {
                            out.append("ack ").append(value).append(' ').append(meta.partition()).append(' ')
                                .append(meta.offset()).append('\n');
                        }
                        if (out.length() > 1 << 16) {
                            System.out.print(out);
                            out.setLength(0);
                        }
                    }
                });
                if (i % 100 == 0) {
                    Thread.sleep(10); // load, not a flood
                }
            }
            producer.flush();
        }
        synchronized (out) {
            System.out.print(out);
        }
        System.out.println("done");
        System.out.flush();
        System.exit(failed.get() == 0 ? 0 : 1);
    }
}
