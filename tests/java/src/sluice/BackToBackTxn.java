package sluice;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Transactions ended back to back with Apache Kafka's Java client: {@code ROUNDS} transactions
 * of one record each, none flushed before its end, every third aborted and the others
 * committed, each begun the moment the previous one's end returned (at transaction version 2,
 * while that end's markers are still being written). Then a read_committed consumer reads the
 * topic from the start: exactly the committed records, in order.
 *
 * <p>Run as a single-file program: {@code java -cp 'target/java-deps/*'
 * tests/java/src/sluice/BackToBackTxn.java BOOTSTRAP TOPIC TRANSACTIONAL_ID}. The topic must
 * exist with one partition. Prints {@code PASS} and the committed values, or {@code FAIL why},
 * and exits 0 or 1.
 */
public final class BackToBackTxn {
    static final int ROUNDS = 10;

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: BackToBackTxn BOOTSTRAP TOPIC TRANSACTIONAL_ID");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, args[2]);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "60000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "60000");
        List<String> committed = new ArrayList<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            for (int i = 0; i < ROUNDS; i++) {
                producer.beginTransaction();
                String value = "txn-" + i;
                producer.send(new ProducerRecord<>(topic, 0, "k", value));
                if (i % 3 == 1) {
                    producer.abortTransaction();
                } else {
                    producer.commitTransaction();
                    committed.add(value);
                }
            }
        } catch (Exception e) {
            System.out.println("FAIL the transactions: " + e);
            System.exit(1);
        }
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        List<String> read = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            TopicPartition tp = new TopicPartition(topic, 0);
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            Map<TopicPartition, Long> end = consumer.endOffsets(List.of(tp));
            long deadline = System.currentTimeMillis() + 30_000;
            while (consumer.position(tp) < end.get(tp) && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    read.add(r.value());
                }
            }
        }
        if (!read.equals(committed)) {
            System.out.println("FAIL read_committed read " + read + ", committed were " + committed);
            System.exit(1);
        }
        System.out.println("PASS " + String.join(",", read));
    }
}
