package sluice;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.StreamsGroupDescription;
import org.apache.kafka.clients.admin.StreamsGroupMemberAssignment;
import org.apache.kafka.clients.admin.StreamsGroupMemberDescription;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.LongDeserializer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;

/**
 * Kafka Streams 4.4 with {@code group.protocol=streams} (KIP-1071) against a running broker: a
 * word count ({@link StreamsApp}: split lines, regroup by word through a repartition topic, count
 * in a state store with a changelog topic) whose output is checked word by word against the
 * counts of every line the test wrote.
 * <ol>
 * <li>exactly_once_v2: one instance counts every word; the broker created the repartition and
 * changelog topics with the input's partition count; StreamsGroupDescribe shows one member with
 * all eight tasks (two subtopologies, four partitions);
 * <li>scaled from one instance to three (one in a JVM of its own): each gets tasks, no task
 * twice, and the counts stay exact;
 * <li>the JVM instance killed with SIGKILL while lines are written: its tasks move to the others
 * once its session ends, and read_committed output is still exact: never a count above the
 * truth, every final count right;
 * <li>kafka-streams-groups lists and describes the group, then, once the instances have left,
 * resets its input offsets and deletes it;
 * <li>at_least_once: one instance, exact counts without faults.
 * </ol>
 * Arguments: bootstrap, work directory. The broker's {@code group.streams.session.timeout.ms} is
 * expected short (the test run gives 6 s) so that the killed instance's tasks move in time.
 */
public final class StreamsTest {
    private static final long DEADLINE_MS = 240_000;
    private static final String[] WORDS = new String[24];

    static {
        for (int i = 0; i < WORDS.length; i++) {
            WORDS[i] = "w" + i;
        }
    }

    private final String bootstrap;
    private final Path work;
    private final Admin admin;
    private final String run = Long.toString(System.nanoTime() % 1_000_000_000L, 36);
    private final List<Process> spawned = new ArrayList<>();
    private final List<KafkaStreams> instances = new ArrayList<>();
    private int passed;
    private int failed;

    private StreamsTest(String bootstrap, Path work) {
        this.bootstrap = bootstrap;
        this.work = work;
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        this.admin = Admin.create(p);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: sluice.StreamsTest BOOTSTRAP WORK_DIR");
            System.exit(2);
        }
        StreamsTest t = new StreamsTest(args[0], Path.of(args[1]));
        Files.createDirectories(t.work);
        Runtime.getRuntime().addShutdownHook(new Thread(t::killEverything, "kill-spawned"));
        Thread deadline = new Thread(() -> {
            try {
                Thread.sleep(DEADLINE_MS);
            } catch (InterruptedException e) {
                return;
            }
            synchronized (System.out) {
                System.out.println("FAIL streams: finished within " + DEADLINE_MS / 1000 + " s: still running; stopping");
                System.out.println("streams: " + t.passed + " passed, " + (t.failed + 1) + " failed");
                System.out.flush();
            }
            Runtime.getRuntime().exit(1);
        }, "deadline");
        deadline.setDaemon(true);
        deadline.start();
        try {
            t.exactlyOnce();
        } catch (Exception e) {
            t.fail("streams exactly_once_v2 scenario", e.toString());
        }
        t.closeInstances();
        try {
            t.atLeastOnce();
        } catch (Exception e) {
            t.fail("streams at_least_once scenario", e.toString());
        }
        t.closeInstances();
        t.admin.close();
        System.out.printf("streams: %d passed, %d failed%n", t.passed, t.failed);
        System.exit(t.failed == 0 ? 0 : 1);
    }

    private synchronized void pass(String name) {
        passed++;
        System.out.println("PASS " + name);
    }

    private synchronized void fail(String name, String why) {
        failed++;
        System.out.println("FAIL " + name + ": " + why);
    }

    private void check(String name, boolean ok, String detail) {
        if (ok) {
            pass(name);
        } else {
            fail(name, detail);
        }
    }

    private static boolean waitFor(long ms, BooleanSupplier condition) throws InterruptedException {
        long end = System.currentTimeMillis() + ms;
        while (System.currentTimeMillis() < end) {
            if (condition.getAsBoolean()) {
                return true;
            }
            Thread.sleep(200);
        }
        return condition.getAsBoolean();
    }

    // ------------------------------------------------------------------ the word count's data

    /** Lines of three words, deterministic per seed; their word counts are added to `counts`. */
    private static List<String> lines(long seed, int n, Map<String, Long> counts) {
        Random r = new Random(seed);
        List<String> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            StringBuilder line = new StringBuilder();
            for (int w = 0; w < 3; w++) {
                String word = WORDS[r.nextInt(WORDS.length)];
                counts.merge(word, 1L, Long::sum);
                line.append(w == 0 ? "" : " ").append(word);
            }
            out.add(line.toString());
        }
        return out;
    }

    private void write(String topic, List<String> lines) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        try (KafkaProducer<String, String> producer =
                 new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
            int i = 0;
            for (String line : lines) {
                // Keys spread the lines over the partitions; the count regroups by word anyway.
                producer.send(new ProducerRecord<>(topic, "k" + (i++), line)).get();
            }
        }
    }

    /** Reads the output topic (read_committed) from the start: the last count of each word and
     *  the largest count ever written for it. */
    private static final class Output implements AutoCloseable {
        final KafkaConsumer<String, Long> consumer;
        final Map<String, Long> last = new TreeMap<>();
        final Map<String, Long> max = new TreeMap<>();

        Output(String bootstrap, String topic, int partitions) {
            Properties p = new Properties();
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
            consumer = new KafkaConsumer<>(p, new StringDeserializer(), new LongDeserializer());
            List<TopicPartition> tps = new ArrayList<>();
            for (int i = 0; i < partitions; i++) {
                tps.add(new TopicPartition(topic, i));
            }
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
        }

        void poll() {
            for (ConsumerRecord<String, Long> r : consumer.poll(Duration.ofMillis(200))) {
                last.put(r.key(), r.value());
                max.merge(r.key(), r.value(), Math::max);
            }
        }

        @Override
        public void close() {
            consumer.close();
        }
    }

    private boolean countsReach(Output out, Map<String, Long> expected, long ms) throws InterruptedException {
        return waitFor(ms, () -> {
            out.poll();
            return out.last.equals(expected);
        });
    }

    private static String diff(Map<String, Long> got, Map<String, Long> want) {
        StringBuilder b = new StringBuilder();
        for (String w : WORDS) {
            Long g = got.get(w);
            Long x = want.get(w);
            if (g == null ? x != null : !g.equals(x)) {
                b.append(w).append(": got ").append(g).append(", want ").append(x).append("; ");
            }
        }
        return b.length() == 0 ? "same" : b.toString();
    }

    // ------------------------------------------------------------------ instances

    private KafkaStreams startInstance(String appId, String input, String output, String guarantee, String name)
            throws InterruptedException {
        KafkaStreams s = StreamsApp.wordCount(bootstrap, appId, input, output,
            work.resolve(name).toString(), guarantee);
        synchronized (instances) {
            instances.add(s);
        }
        s.start();
        return s;
    }

    private Process spawnInstance(String appId, String input, String output, String guarantee, String name)
            throws IOException {
        List<String> cmd = List.of(
            Path.of(System.getProperty("java.home"), "bin", "java").toString(),
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", System.getProperty("java.class.path"),
            "sluice.StreamsApp", bootstrap, appId, input, output, work.resolve(name).toString(), guarantee);
        ProcessBuilder pb = new ProcessBuilder(cmd);
        pb.redirectError(ProcessBuilder.Redirect.appendTo(work.resolve(name + ".stderr").toFile()));
        pb.redirectOutput(ProcessBuilder.Redirect.appendTo(work.resolve(name + ".stdout").toFile()));
        pb.redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
        Process p = pb.start();
        synchronized (spawned) {
            spawned.add(p);
        }
        return p;
    }

    private void closeInstances() {
        List<KafkaStreams> all;
        synchronized (instances) {
            all = new ArrayList<>(instances);
            instances.clear();
        }
        for (KafkaStreams s : all) {
            s.close(Duration.ofSeconds(15));
        }
    }

    private void killEverything() {
        synchronized (spawned) {
            for (Process p : spawned) {
                p.destroyForcibly();
            }
        }
    }

    private StreamsGroupDescription describe(String appId) throws Exception {
        return admin.describeStreamsGroups(List.of(appId)).describedGroups().get(appId).get(10, TimeUnit.SECONDS);
    }

    private static List<String> activeTasks(StreamsGroupMemberDescription m) {
        List<String> out = new ArrayList<>();
        for (StreamsGroupMemberAssignment.TaskIds t : m.assignment().activeTasks()) {
            for (int p : t.partitions()) {
                out.add(t.subtopologyId() + "_" + p);
            }
        }
        return out;
    }

    /** Every member holds active tasks, each of the `tasks` tasks exactly once, all Stable. */
    private boolean spread(String appId, int members, int tasks) {
        try {
            StreamsGroupDescription d = describe(appId);
            if (d.groupState() != GroupState.STABLE || d.members().size() != members) {
                return false;
            }
            Set<String> seen = new HashSet<>();
            for (StreamsGroupMemberDescription m : d.members()) {
                List<String> a = activeTasks(m);
                if (a.isEmpty()) {
                    return false;
                }
                for (String t : a) {
                    if (!seen.add(t)) {
                        return false;
                    }
                }
            }
            return seen.size() == tasks;
        } catch (Exception e) {
            return false;
        }
    }

    /** kafka-streams-groups in a JVM of its own; its standard output. */
    private String cli(String... args) throws Exception {
        List<String> cmd = new ArrayList<>(List.of(
            Path.of(System.getProperty("java.home"), "bin", "java").toString(),
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", System.getProperty("java.class.path"),
            "org.apache.kafka.tools.streams.StreamsGroupCommand", "--bootstrap-server", bootstrap));
        cmd.addAll(List.of(args));
        ProcessBuilder pb = new ProcessBuilder(cmd);
        pb.redirectError(ProcessBuilder.Redirect.appendTo(work.resolve("cli.stderr").toFile()));
        pb.redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
        Process p = pb.start();
        byte[] out = p.getInputStream().readAllBytes();
        if (!p.waitFor(60, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new IOException("kafka-streams-groups " + String.join(" ", args) + " did not finish");
        }
        return new String(out, StandardCharsets.UTF_8);
    }

    // ------------------------------------------------------------------ scenarios

    private void exactlyOnce() throws Exception {
        String app = "wc-eos-" + run;
        String input = app + "-lines";
        String output = app + "-counts";
        admin.createTopics(List.of(new NewTopic(input, 4, (short) 1), new NewTopic(output, 4, (short) 1)))
            .all().get(30, TimeUnit.SECONDS);
        Map<String, Long> expected = new TreeMap<>();
        try (Output out = new Output(bootstrap, output, 4)) {
            startInstance(app, input, output, StreamsConfig.EXACTLY_ONCE_V2, "eos-1");
            write(input, lines(1, 400, expected));
            check("streams eos: one instance counts every word of 400 lines exactly",
                countsReach(out, expected, 60_000), diff(out.last, expected));

            Map<String, Integer> internal = new TreeMap<>();
            for (TopicDescription t : admin.describeTopics(List.of(app + "-counts-repartition", app + "-counts-changelog"))
                     .allTopicNames().get(10, TimeUnit.SECONDS).values()) {
                internal.put(t.name(), t.partitions().size());
            }
            check("streams eos: the broker created the repartition and changelog topics with 4 partitions each",
                internal.equals(Map.of(app + "-counts-repartition", 4, app + "-counts-changelog", 4)),
                internal.toString());
            StreamsGroupDescription d = describe(app);
            int tasks = d.members().stream().mapToInt(m -> activeTasks(m).size()).sum();
            check("streams eos: StreamsGroupDescribe shows one member running all 8 tasks, 2 subtopologies",
                d.members().size() == 1 && tasks == 8 && d.subtopologies().size() == 2
                    && d.groupState() == GroupState.STABLE,
                d.toString());

            // Scale out: a JVM of its own and a second in-process instance.
            Process child = spawnInstance(app, input, output, StreamsConfig.EXACTLY_ONCE_V2, "eos-2");
            startInstance(app, input, output, StreamsConfig.EXACTLY_ONCE_V2, "eos-3");
            boolean spreadOut = waitFor(60_000, () -> spread(app, 3, 8));
            check("streams eos: scaled to three instances, each runs tasks and no task runs twice",
                spreadOut, describe(app).toString());
            write(input, lines(2, 400, expected));
            check("streams eos: three instances count 400 more lines exactly",
                countsReach(out, expected, 60_000), diff(out.last, expected));

            String listed = cli("--list");
            check("streams eos: kafka-streams-groups --list names the group", listed.lines().anyMatch(app::equals), listed);
            String members = cli("--describe", "--group", app, "--members");
            long memberLines = members.lines().filter(l -> l.startsWith(app + " ")).count();
            check("streams eos: kafka-streams-groups --describe --members shows three members",
                memberLines == 3, members);

            // SIGKILL the JVM instance halfway through the next lines.
            List<String> more = lines(3, 600, expected);
            write(input, more.subList(0, 300));
            child.destroyForcibly();
            if (!child.waitFor(10, TimeUnit.SECONDS)) {
                throw new IOException("the instance JVM survived SIGKILL for 10 s");
            }
            write(input, more.subList(300, 600));
            boolean exact = countsReach(out, expected, 90_000);
            check("streams eos: after an instance is killed with SIGKILL, read_committed counts are exact",
                exact, diff(out.last, expected));
            boolean never = true;
            for (Map.Entry<String, Long> e : out.max.entrySet()) {
                if (e.getValue() > expected.getOrDefault(e.getKey(), 0L)) {
                    never = false;
                }
            }
            check("streams eos: no count was ever above the truth (nothing processed twice)",
                never, "max " + out.max + " expected " + expected);
            check("streams eos: after the kill the two remaining instances run all 8 tasks",
                waitFor(30_000, () -> spread(app, 2, 8)), describe(app).toString());
        }
        closeInstances();
        // The instances left on close: the group is empty, its offsets may be reset and it may
        // be deleted.
        check("streams eos: the group is empty once its instances closed",
            waitFor(20_000, () -> {
                try {
                    return describe(app).members().isEmpty();
                } catch (Exception e) {
                    return false;
                }
            }), describe(app).toString());
        String reset = cli("--reset-offsets", "--group", app, "--input-topic", input, "--to-earliest", "--execute");
        long resetLines = reset.lines().filter(l -> l.contains(input) && l.trim().endsWith(" 0")).count();
        check("streams eos: kafka-streams-groups --reset-offsets --to-earliest sets the input's 4 partitions to 0",
            resetLines == 4, reset);
        Map<TopicPartition, org.apache.kafka.clients.consumer.OffsetAndMetadata> committed =
            admin.listConsumerGroupOffsets(app).partitionsToOffsetAndMetadata().get(10, TimeUnit.SECONDS);
        long atZero = committed.entrySet().stream()
            .filter(e -> e.getKey().topic().equals(input) && e.getValue().offset() == 0).count();
        check("streams eos: the reset offsets are committed", atZero == 4, committed.toString());
        String deleted = cli("--delete", "--group", app);
        boolean gone = waitFor(10_000, () -> {
            try {
                return !cli("--list").lines().anyMatch(app::equals);
            } catch (Exception e) {
                return false;
            }
        });
        check("streams eos: kafka-streams-groups --delete removes the group", gone, deleted);
    }

    private void atLeastOnce() throws Exception {
        String app = "wc-alos-" + run;
        String input = app + "-lines";
        String output = app + "-counts";
        admin.createTopics(List.of(new NewTopic(input, 2, (short) 1), new NewTopic(output, 2, (short) 1)))
            .all().get(30, TimeUnit.SECONDS);
        Map<String, Long> expected = new TreeMap<>();
        try (Output out = new Output(bootstrap, output, 2)) {
            startInstance(app, input, output, StreamsConfig.AT_LEAST_ONCE, "alos-1");
            write(input, lines(4, 300, expected));
            check("streams at_least_once: one instance counts every word of 300 lines exactly",
                countsReach(out, expected, 60_000), diff(out.last, expected));
        }
    }
}
