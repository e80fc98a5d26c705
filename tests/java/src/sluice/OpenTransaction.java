package sluice;

import java.util.Properties;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Leaves a transaction open, as a transactional producer that dies mid-transaction does: begins
 * a transaction, writes {@code count} records to partition 0 of {@code topic} with timestamps
 * {@code age_ms} in the past (so that {@code kafka-transactions find-hanging} counts it as old),
 * prints {@code open FIRST_OFFSET}, and halts the JVM without committing, aborting or
 * closing. The transaction timeout is Kafka's maximum default (15 minutes), so the coordinator
 * keeps it Ongoing for the length of a test. Arguments: BOOTSTRAP TOPIC TRANSACTIONAL_ID COUNT
 * AGE_MS.
 */
public final class OpenTransaction {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        String transactionalId = args[2];
        int count = Integer.parseInt(args[3]);
        long ageMs = Long.parseLong(args[4]);
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        props.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "900000");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        KafkaProducer<String, String> producer = new KafkaProducer<>(props);
        producer.initTransactions();
        producer.beginTransaction();
        long timestamp = System.currentTimeMillis() - ageMs;
        long first = -1;
        for (int i = 0; i < count; i++) {
            RecordMetadata meta = producer
                .send(new ProducerRecord<>(topic, 0, timestamp, "k" + i, "open " + i))
                .get();
            if (first < 0) {
                first = meta.offset();
            }
        }
        System.out.println("open " + first);
        System.out.flush();
        // No commit, no abort, no close: the transaction stays open as if the process died.
        Runtime.getRuntime().halt(0);
    }

}
