package sluice;

import java.time.Duration;
import java.util.Arrays;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

/**
 * One Kafka Streams instance of the word count that {@link StreamsTest} runs, with
 * {@code group.protocol=streams}: lines of the input topic split into words, regrouped by word
 * (a repartition topic), counted in a state store (a changelog topic), each new count written
 * to the output topic. Run in a JVM of its own so that a test can kill it with SIGKILL; it
 * prints {@code RUNNING} once it processes and runs until killed.
 *
 * <p>Arguments: bootstrap, application id, input topic, output topic, state directory,
 * processing guarantee.
 */
public final class StreamsApp {
    private StreamsApp() {}

    /** The word count, with the settings every instance shares. */
    static KafkaStreams wordCount(String bootstrap, String appId, String input, String output,
                                  String stateDir, String guarantee) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
            .flatMapValues(line -> Arrays.asList(line.split(" ")))
            .groupBy((key, word) -> word)
            .count(Materialized.as("counts"))
            .toStream()
            .to(output, Produced.with(Serdes.String(), Serdes.Long()));
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, "streams");
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        return new KafkaStreams(builder.build(), p);
    }

    public static void main(String[] args) throws Exception {
        KafkaStreams streams = wordCount(args[0], args[1], args[2], args[3], args[4], args[5]);
        CountDownLatch dead = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                System.out.println("RUNNING");
                System.out.flush();
            }
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                System.out.println("STOPPED " + now);
                System.out.flush();
                dead.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(10))));
        streams.start();
        dead.await();
    }
}
