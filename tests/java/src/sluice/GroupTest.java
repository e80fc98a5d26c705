package sluice;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.Supplier;
import java.util.regex.Pattern;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Consumer groups with Apache Kafka's Java client against real Sluice brokers this program starts
 * (the classic protocol, eager and cooperative-sticky, and KIP-848's {@code group.protocol=consumer}).
 *
 * <p>Members are separate JVMs ({@link GroupMember}) so that one can be killed with SIGKILL
 * ({@link Process#destroyForcibly()}, by its PID). Each logs what it was assigned, revoked and lost,
 * every record it consumed and every commit; the checks here read those logs back and assert on
 * the data: at every moment each partition has at most one owner and records are consumed only
 * by their owner; with no failure every record is consumed exactly once; after a kill nothing is
 * lost and only what the dead member consumed after its last commit is consumed again, starting
 * exactly at that commit; a newcomer only takes partitions that move to it; committed offsets
 * survive broker restarts; two groups read independently; reset-offsets moves where a group starts.
 *
 * <p>Usage: {@code sluice.GroupTest SLUICE_BIN WORK_DIR}. Every check prints {@code PASS name} or
 * {@code FAIL name: why}; the last line is {@code java-groups: N passed, N failed}. Every process it
 * starts is killed by PID when it ends, also on failure or SIGTERM. Each scenario keeps its members'
 * logs and output under WORK_DIR/SCENARIO/, each broker its data and sluice.log.
 *
 * <p>For debugging: {@code JAVA_GROUPS_ONLY=REGEX} runs only the scenarios whose directory name
 * matches (e.g. {@code three-consumer|kill-.*}); {@code JAVA_GROUPS_MEMBER_OPTS} adds JVM options to
 * every member, e.g. {@code -Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients.NetworkClient=debug}
 * to have each member's stderr file show every request and response.
 */
public final class GroupTest {
    static final int PARTITIONS = 6;
    static final int STREAM = 20_000;
    /** Records per second while members come, go and die: the stream lasts about 5 s. */
    static final int RATE = 4_000;
    /** A new classic group waits this long for more members (Kafka's default is 3000 ms). */
    static final int INITIAL_REBALANCE_DELAY_MS = 300;

    static final long CLASSIC_SESSION_MS = 6_000;
    static final long CLASSIC_HEARTBEAT_MS = 1_000;
    static final List<String> CLASSIC = List.of("session.timeout.ms=" + CLASSIC_SESSION_MS,
        "heartbeat.interval.ms=" + CLASSIC_HEARTBEAT_MS);
    static final List<String> COOPERATIVE = List.of("session.timeout.ms=" + CLASSIC_SESSION_MS,
        "heartbeat.interval.ms=" + CLASSIC_HEARTBEAT_MS,
        "partition.assignment.strategy=org.apache.kafka.clients.consumer.CooperativeStickyAssignor");
    /**
     * KIP-848: the broker owns the session timeout, the heartbeat interval and the assignor, so
     * the client may not set session.timeout.ms, heartbeat.interval.ms or the assignment strategy.
     * The brokers here are started with group.consumer.session.timeout.ms 6 s (Kafka's default,
     * 45 s, would make the kill scenario wait that long) and group.consumer.heartbeat.interval.ms
     * 2 s.
     */
    static final List<String> CONSUMER = List.of("group.protocol=consumer");
    static final long CONSUMER_SESSION_MS = 6_000;
    static final long CONSUMER_HEARTBEAT_MS = 2_000;

    /** Bounds for a stuck broker or client; a passing run takes a fraction of these. */
    static final long STABLE_MS = 30_000;
    static final long DONE_MS = 90_000;
    static final long DRIVER_DEADLINE_MS = 400_000;

    static final long T0 = System.nanoTime();

    private final Path sluiceBin;
    private final Path work;
    private final List<Process> spawned = Collections.synchronizedList(new ArrayList<>());
    private final List<Broker> brokers = Collections.synchronizedList(new ArrayList<>());
    private int passed;
    private int failed;

    private GroupTest(Path sluiceBin, Path work) {
        this.sluiceBin = sluiceBin;
        this.work = work;
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: sluice.GroupTest SLUICE_BIN WORK_DIR");
            System.exit(2);
        }
        GroupTest t = new GroupTest(Path.of(args[0]), Path.of(args[1]));
        Files.createDirectories(t.work);
        // Whatever happens (a failure, SIGTERM from `timeout`), no member or broker outlives this.
        Runtime.getRuntime().addShutdownHook(new Thread(t::killEverything, "kill-spawned"));
        Thread deadline = new Thread(() -> {
            try {
                Thread.sleep(DRIVER_DEADLINE_MS);
            } catch (InterruptedException e) {
                return;
            }
            synchronized (System.out) {
                System.out.println("FAIL groups: finished within " + DRIVER_DEADLINE_MS / 1000 + " s: still running; stopping");
                System.out.println("java-groups: " + t.passed + " passed, " + (t.failed + 1) + " failed");
                System.out.flush();
            }
            Runtime.getRuntime().exit(1);
        }, "deadline");
        deadline.setDaemon(true);
        deadline.start();
        t.runAll();
        System.out.printf("java-groups: %d passed, %d failed%n", t.passed, t.failed);
        System.exit(t.failed == 0 ? 0 : 1);
    }

    private void killEverything() {
        List<Process> all;
        synchronized (spawned) {
            all = new ArrayList<>(spawned);
        }
        for (Process p : all) {
            if (p.isAlive()) {
                p.destroyForcibly();
            }
        }
        for (Process p : all) {
            try {
                p.waitFor(5, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
    }

    // ---------------------------------------------------------------- checks and scenarios

    /** A failed step: the scenario stops here with this reason. */
    static final class Failure extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Failure(String why) {
            super(why);
        }
    }

    /** The checks of one scenario, printed together when it ends. */
    final class Scenario {
        final String title;
        final Path dir;
        final List<String> lines = new ArrayList<>();
        final List<Member> members = new ArrayList<>();
        int ok;
        int bad;

        Scenario(String title, String slug) throws IOException {
            this.title = title;
            this.dir = work.resolve(slug);
            Files.createDirectories(dir);
        }

        void pass(String name) {
            ok++;
            lines.add("PASS " + title + ": " + name);
        }

        void fail(String name, String why) {
            bad++;
            lines.add("FAIL " + title + ": " + name + ": " + why);
        }

        /** A check that passes when {@code why} is null. */
        boolean check(String name, String why) {
            if (why == null) {
                pass(name);
            } else {
                fail(name, why);
            }
            return why == null;
        }

        boolean checkEquals(String name, Object expected, Object actual) {
            return check(name, java.util.Objects.equals(expected, actual) ? null
                : "expected <" + expected + "> but got <" + actual + ">");
        }

        void note(String line) {
            lines.add("  " + title + ": " + line);
        }

        Member member(String name, String bootstrap, String group, String topic, List<String> config,
                      long commitDelayMs, String revokeCommit) throws IOException {
            Member m = new Member(dir, name, bootstrap, group, topic, config, commitDelayMs, revokeCommit);
            members.add(m);
            return m;
        }
    }

    interface Body {
        void run(Scenario s) throws Exception;
    }

    private void scenario(String title, String slug, Body body) {
        String only = System.getenv("JAVA_GROUPS_ONLY");
        if (only != null && !only.isEmpty() && !slug.matches(only)) {
            return;
        }
        long start = System.nanoTime();
        Scenario s;
        try {
            s = new Scenario(title, slug);
        } catch (IOException e) {
            report(List.of("FAIL " + title + ": cannot create its directory: " + e), 0, 1);
            return;
        }
        try {
            body.run(s);
        } catch (Failure e) {
            s.fail("ran to the end", e.getMessage());
        } catch (Throwable e) {
            Throwable c = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
            StringBuilder where = new StringBuilder();
            for (StackTraceElement el : c.getStackTrace()) {
                if (el.getClassName().startsWith("sluice.")) {
                    where.append(" at ").append(el.getMethodName()).append(':').append(el.getLineNumber());
                    break;
                }
            }
            s.fail("ran to the end", "threw " + c + where);
        } finally {
            for (Member m : s.members) {
                m.destroy();
            }
        }
        s.lines.add(String.format("  %s: took %.1f s", title, (System.nanoTime() - start) / 1e9));
        report(s.lines, s.ok, s.bad);
    }

    private void report(List<String> lines, int ok, int bad) {
        synchronized (System.out) {
            for (String l : lines) {
                System.out.println(l);
            }
            System.out.flush();
            passed += ok;
            failed += bad;
        }
    }

    private void runAll() {
        Broker shared;
        try {
            shared = new Broker(work.resolve("broker"));
            shared.start();
        } catch (Exception e) {
            report(List.of("FAIL groups: start a broker: " + e), 0, 1);
            return;
        }
        System.out.println("groups: sluice pid " + shared.proc.pid() + " on " + shared.bootstrap());
        String b = shared.bootstrap();
        scenario("groups restart", "restart", this::restarts);
        scenario("groups classic 3 members", "three-classic", s -> threeMembers(s, b, "classic"));
        scenario("groups consumer-protocol 3 members", "three-consumer", s -> threeMembers(s, b, "consumer"));
        scenario("groups classic kill -9", "kill-classic", s -> killed(s, b, "classic"));
        scenario("groups consumer-protocol kill -9", "kill-consumer", s -> killed(s, b, "consumer"));
        scenario("groups cooperative-sticky join", "join-cooperative", s -> joinUnderLoad(s, b, "cooperative"));
        scenario("groups consumer-protocol join", "join-consumer", s -> joinUnderLoad(s, b, "consumer"));
        scenario("groups two groups", "two-groups", s -> twoGroups(s, b));
        scenario("groups reset-offsets", "reset", s -> resetOffsets(s, b));

        List<String> end = new ArrayList<>();
        int ok = 0;
        int bad = 0;
        int status = shared.stop();
        if (status == 0) {
            ok++;
            end.add("PASS groups: broker exits 0 on SIGTERM");
        } else {
            bad++;
            end.add("FAIL groups: broker exits 0 on SIGTERM: exit status " + status);
        }
        List<String> errors = new ArrayList<>();
        for (Broker br : brokers) {
            errors.addAll(br.logErrors());
        }
        if (errors.isEmpty()) {
            ok++;
            end.add("PASS groups: broker logs free of panics and errors");
        } else {
            bad++;
            end.add("FAIL groups: broker logs free of panics and errors: " + errors.subList(0, Math.min(5, errors.size())));
        }
        report(end, ok, bad);
    }

    // ---------------------------------------------------------------- brokers

    final class Broker {
        final Path dir;
        final Path log;
        int port;
        Process proc;

        Broker(Path dir) throws IOException {
            this.dir = dir;
            this.log = dir.resolve("sluice.log");
            Files.createDirectories(dir);
            brokers.add(this);
        }

        String bootstrap() {
            return "127.0.0.1:" + port;
        }

        /** Starts on a free port the first time, on the same port after that. */
        void start() throws Exception {
            boolean again = port != 0;
            for (int attempt = 1; attempt <= 5; attempt++) {
                if (!again) {
                    try (ServerSocket ss = new ServerSocket(0, 1, InetAddress.getByName("127.0.0.1"))) {
                        port = ss.getLocalPort();
                    }
                }
                ProcessBuilder pb = new ProcessBuilder(sluiceBin.toString(), "--data-dir", dir.resolve("data").toString(),
                    "--listeners", "PLAINTEXT://127.0.0.1:" + port, "--cores", "2",
                    "--group-initial-rebalance-delay-ms", String.valueOf(INITIAL_REBALANCE_DELAY_MS),
                    "--group-consumer-session-timeout-ms", String.valueOf(CONSUMER_SESSION_MS),
                    "--group-consumer-heartbeat-interval-ms", String.valueOf(CONSUMER_HEARTBEAT_MS));
                pb.redirectErrorStream(true);
                pb.redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile()));
                proc = pb.start();
                spawned.add(proc);
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
                while (proc.isAlive() && System.nanoTime() < deadline && !listening(port)) {
                    Thread.sleep(100);
                }
                if (proc.isAlive() && listening(port)) {
                    return;
                }
                kill();
                if (again && attempt >= 3) {
                    break;
                }
            }
            throw new Failure("sluice did not start on " + bootstrap() + "; log tail: " + tail(log, 600));
        }

        /** SIGTERM by PID; its exit status, or -1 after a SIGKILL when it ignored that for 15 s. */
        int stop() {
            if (proc == null) {
                return -1;
            }
            proc.destroy();
            try {
                if (!proc.waitFor(15, TimeUnit.SECONDS)) {
                    kill();
                    return -1;
                }
                return proc.exitValue();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                kill();
                return -1;
            } finally {
                proc = null;
            }
        }

        /** SIGKILL by PID. */
        void kill() {
            if (proc == null) {
                return;
            }
            proc.destroyForcibly();
            try {
                proc.waitFor(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            proc = null;
        }

        List<String> logErrors() {
            List<String> out = new ArrayList<>();
            try {
                for (String l : Files.readAllLines(log, StandardCharsets.UTF_8)) {
                    if (l.contains("panicked") || l.contains("ERROR")) {
                        out.add(l);
                    }
                }
            } catch (IOException e) {
                out.add("cannot read " + log + ": " + e);
            }
            return out;
        }
    }

    static boolean listening(int port) {
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress("127.0.0.1", port), 200);
            return true;
        } catch (IOException e) {
            return false;
        }
    }

    static String tail(Path p, int chars) {
        try {
            String s = Files.readString(p, StandardCharsets.UTF_8);
            return s.length() <= chars ? s : s.substring(s.length() - chars);
        } catch (IOException e) {
            return "(" + e + ")";
        }
    }

    // ---------------------------------------------------------------- members

    /** One line of a member's log. */
    static final class Event {
        final String member;
        final long t;
        final String ev;
        final String[] f;

        Event(String member, String line) {
            this.member = member;
            String[] w = line.split(" ");
            this.t = Long.parseLong(w[0]);
            this.ev = w[1];
            this.f = Arrays.copyOfRange(w, 2, w.length);
        }

        /** assign, revoke, lost, stopping: the partitions. */
        Set<Integer> parts() {
            Set<Integer> ps = new TreeSet<>();
            if (f.length > 0 && !f[0].equals("-")) {
                for (String p : f[0].split(",")) {
                    ps.add(Integer.parseInt(p));
                }
            }
            return ps;
        }

        /** committing, committed, commit_failed: batch or revoke. */
        String where() {
            return f[0];
        }

        /** committing, committed, commit_failed: the offsets. */
        Map<Integer, Long> offsets() {
            Map<Integer, Long> m = new TreeMap<>();
            if (!f[1].equals("-")) {
                for (String po : f[1].split(",")) {
                    int colon = po.indexOf(':');
                    m.put(Integer.parseInt(po.substring(0, colon)), Long.parseLong(po.substring(colon + 1)));
                }
            }
            return m;
        }

        /** commit_failed: the exception and its message. */
        String error() {
            return String.join(" ", Arrays.copyOfRange(f, 2, f.length));
        }

        @Override
        public String toString() {
            String rest = String.join(" ", f);
            return member + "@" + secs(t) + " " + ev + " " + (rest.length() > 160 ? rest.substring(0, 160) + "..." : rest);
        }
    }

    /** A consumed record: who, when, where, and the producer's sequence number in it. */
    record Rec(String member, long t, int p, long o, long seq) {
    }

    static String secs(long nanos) {
        return String.format("%.3fs", (nanos - T0) / 1e9);
    }

    final class Member {
        final String name;
        final Path log;
        final Path stop;
        final Path err;
        final Process proc;
        volatile Long killedAt;
        private final List<Event> events = new ArrayList<>();
        private final List<Rec> records = new ArrayList<>();
        private long pos;

        Member(Path dir, String name, String bootstrap, String group, String topic, List<String> config,
               long commitDelayMs, String revokeCommit) throws IOException {
            this.name = name;
            this.log = dir.resolve(name + ".log");
            this.stop = dir.resolve(name + ".stop");
            this.err = dir.resolve(name + ".stderr");
            List<String> cmd = new ArrayList<>(List.of(
                Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-Dorg.slf4j.simpleLogger.showDateTime=true"));
            String extra = System.getenv("JAVA_GROUPS_MEMBER_OPTS");
            if (extra != null && !extra.isBlank()) {
                cmd.addAll(Arrays.asList(extra.trim().split("\\s+")));
            }
            cmd.addAll(List.of("-cp", System.getProperty("java.class.path"),
                GroupMember.class.getName(), bootstrap, group, topic, name, log.toString(), stop.toString(),
                String.valueOf(commitDelayMs), revokeCommit));
            cmd.addAll(config);
            ProcessBuilder pb = new ProcessBuilder(cmd);
            pb.redirectErrorStream(true);
            pb.redirectOutput(ProcessBuilder.Redirect.appendTo(err.toFile()));
            pb.redirectInput(ProcessBuilder.Redirect.from(new java.io.File("/dev/null")));
            this.proc = pb.start();
            spawned.add(proc);
        }

        /** Every complete line logged so far (read incrementally). */
        synchronized List<Event> events() {
            try (RandomAccessFile f = new RandomAccessFile(log.toFile(), "r")) {
                long len = f.length();
                if (len > pos) {
                    byte[] buf = new byte[(int) (len - pos)];
                    f.seek(pos);
                    f.readFully(buf);
                    int end = buf.length;
                    while (end > 0 && buf[end - 1] != '\n') {
                        end--;
                    }
                    for (String line : new String(buf, 0, end, StandardCharsets.UTF_8).split("\n")) {
                        if (line.isEmpty()) {
                            continue;
                        }
                        Event e = new Event(name, line);
                        events.add(e);
                        if (e.ev.equals("consumed")) {
                            for (String r : e.f) {
                                String[] w = r.split(":");
                                records.add(new Rec(name, e.t, Integer.parseInt(w[0]), Long.parseLong(w[1]), Long.parseLong(w[2])));
                            }
                        }
                    }
                    pos += end;
                }
            } catch (java.io.FileNotFoundException e) {
                return new ArrayList<>(events);
            } catch (IOException e) {
                throw new Failure("cannot read " + log + ": " + e);
            }
            return new ArrayList<>(events);
        }

        synchronized List<Rec> records() {
            events();
            return new ArrayList<>(records);
        }

        Event last() {
            List<Event> es = events();
            return es.isEmpty() ? null : es.get(es.size() - 1);
        }

        /** SIGKILL to this member's PID; returns the moment it was sent. */
        long kill() throws InterruptedException {
            long t = System.nanoTime();
            killedAt = t;
            proc.destroyForcibly();
            if (!proc.waitFor(10, TimeUnit.SECONDS)) {
                throw new Failure("member " + name + " (pid " + proc.pid() + ") survived SIGKILL for 10 s");
            }
            return t;
        }

        void requestStop() throws IOException {
            Files.writeString(stop, "");
        }

        void waitStopped(long timeoutS) throws InterruptedException {
            if (!proc.waitFor(timeoutS, TimeUnit.SECONDS)) {
                throw new Failure("member " + name + " did not close within " + timeoutS + " s; " + stderr());
            }
            if (proc.exitValue() != 0) {
                throw new Failure("member " + name + " exited with " + proc.exitValue() + "; " + stderr());
            }
            Event l = last();
            if (l == null || !l.ev.equals("closed")) {
                throw new Failure("member " + name + " did not log its close; last event " + l);
            }
        }

        String stderr() {
            String s = tail(err, 1500).trim();
            return s.isEmpty() ? "(no output from " + name + ")" : "--- " + name + " stderr tail: " + s.replace('\n', '|');
        }

        void checkAlive() {
            if (!proc.isAlive() && killedAt == null) {
                throw new Failure("member " + name + " exited with " + proc.exitValue() + "; " + stderr());
            }
        }

        void destroy() {
            if (proc.isAlive()) {
                proc.destroyForcibly();
                try {
                    proc.waitFor(10, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
        }
    }

    // ---------------------------------------------------------------- the producer

    /**
     * Produces {@code count} keyed records (the default, idempotent producer with acks=all) at
     * about {@code rate} per second (0: as fast as it can), in the background, and keeps where
     * each was acknowledged. With {@code holdAt}, it stops after that many records until
     * {@link #release()}.
     */
    static final class Feeder extends Thread {
        final String bootstrap;
        final String topic;
        final long first;
        final int count;
        final int rate;
        final int holdAt;
        final CountDownLatch released = new CountDownLatch(1);
        volatile int sent;
        final int[] partition;
        final long[] offset;
        final AtomicInteger errors = new AtomicInteger();
        final AtomicReference<Exception> firstError = new AtomicReference<>();
        volatile Throwable crash;

        Feeder(String bootstrap, String topic, long first, int count, int rate, int holdAt) {
            super("feeder-" + topic);
            setDaemon(true);
            this.bootstrap = bootstrap;
            this.topic = topic;
            this.first = first;
            this.count = count;
            this.rate = rate;
            this.holdAt = holdAt;
            this.partition = new int[count];
            this.offset = new long[count];
            Arrays.fill(partition, -1);
        }

        void release() {
            released.countDown();
        }

        @Override
        public void run() {
            Properties p = new Properties();
            p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
            try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
                long started = System.nanoTime();
                for (int i = 0; i < count; i++) {
                    if (i == holdAt) {
                        if (!released.await(60, TimeUnit.SECONDS)) {
                            throw new IllegalStateException("the stream was held at " + i + " records for 60 s");
                        }
                        started = System.nanoTime() - (rate > 0 ? i * 1_000_000_000L / rate : 0);
                    }
                    if (rate > 0 && i % 100 == 0) {
                        long ahead = started + i * 1_000_000_000L / rate - System.nanoTime();
                        if (ahead > 0) {
                            Thread.sleep(ahead / 1_000_000, (int) (ahead % 1_000_000));
                        }
                    }
                    final int idx = i;
                    long seq = first + i;
                    producer.send(new ProducerRecord<>(topic, GroupMember.keyOf(seq), GroupMember.valueOf(seq)), (md, e) -> {
                        if (e != null) {
                            errors.incrementAndGet();
                            firstError.compareAndSet(null, e);
                        } else {
                            partition[idx] = md.partition();
                            offset[idx] = md.offset();
                        }
                    });
                    sent = i + 1;
                }
                producer.flush();
            } catch (Throwable e) {
                crash = e;
            }
        }

        /** {(partition, offset) key: seq} of every record; fails unless every one was acknowledged. */
        Map<Long, Long> result() throws InterruptedException {
            join(90_000);
            if (isAlive()) {
                throw new Failure("the producer of " + topic + " is still running after 90 s (" + sent + " sent)");
            }
            if (crash != null) {
                throw new Failure("the producer of " + topic + " failed: " + crash);
            }
            if (errors.get() > 0) {
                throw new Failure(errors.get() + " sends to " + topic + " failed, first: " + firstError.get());
            }
            Map<Long, Long> at = new HashMap<>();
            for (int i = 0; i < count; i++) {
                if (partition[i] < 0) {
                    throw new Failure("record " + (first + i) + " was never acknowledged");
                }
                if (at.put(key(partition[i], offset[i]), first + i) != null) {
                    throw new Failure("two records were acknowledged at " + partition[i] + "@" + offset[i]);
                }
            }
            return at;
        }
    }

    static long key(int p, long o) {
        return ((long) p << 40) | o;
    }

    static int partOf(long key) {
        return (int) (key >>> 40);
    }

    static long offOf(long key) {
        return key & ((1L << 40) - 1);
    }

    static String tp(long key) {
        return partOf(key) + "@" + offOf(key);
    }

    /** The end offset of every partition of {@code at}; fails when offsets have gaps. */
    static Map<Integer, Long> endsOf(Map<Long, Long> at, int partitions) {
        Map<Integer, Long> ends = new TreeMap<>();
        Map<Integer, Long> n = new HashMap<>();
        for (int p = 0; p < partitions; p++) {
            ends.put(p, 0L);
        }
        for (long k : at.keySet()) {
            ends.merge(partOf(k), offOf(k) + 1, Math::max);
            n.merge(partOf(k), 1L, Long::sum);
        }
        for (var e : ends.entrySet()) {
            if (n.getOrDefault(e.getKey(), 0L).longValue() != e.getValue()) {
                throw new Failure("partition " + e.getKey() + " offsets have gaps: " + n.get(e.getKey()) + " records below " + e.getValue());
            }
        }
        return ends;
    }

    static Map<Long, Long> produce(String bootstrap, String topic, long first, int count) throws InterruptedException {
        Feeder f = new Feeder(bootstrap, topic, first, count, 0, -1);
        f.start();
        return f.result();
    }

    // ---------------------------------------------------------------- reading the members' logs

    record Interval(String member, int p, long start, long end) {
    }

    static final class Ownership {
        final List<Interval> intervals = new ArrayList<>();
        /** What each live member owns now. */
        final Map<String, Set<Integer>> now = new TreeMap<>();
    }

    static List<Event> allEvents(List<Member> ms) {
        List<Event> all = new ArrayList<>();
        for (Member m : ms) {
            all.addAll(m.events());
        }
        all.sort(Comparator.comparingLong(e -> e.t));
        return all;
    }

    static List<Rec> consumed(List<Member> ms) {
        List<Rec> all = new ArrayList<>();
        for (Member m : ms) {
            all.addAll(m.records());
        }
        all.sort(Comparator.comparingLong(Rec::t));
        return all;
    }

    /**
     * Replays each member's assign, revoke and lost events: every interval a member owned a
     * partition (from its assign callback to the end of its revoke or lost callback, its close or
     * its SIGKILL). Fails on an assign of a partition it owns or a revoke of one it does not.
     */
    static Ownership ownership(List<Member> ms) {
        Ownership o = new Ownership();
        for (Member m : ms) {
            Map<Integer, Long> owned = new TreeMap<>();
            boolean closed = false;
            for (Event e : m.events()) {
                switch (e.ev) {
                    case "assign" -> {
                        for (int p : e.parts()) {
                            if (owned.containsKey(p)) {
                                throw new Failure(m.name + " was assigned partition " + p + " it already owned (" + e + ")");
                            }
                            owned.put(p, e.t);
                        }
                    }
                    case "revoke", "lost" -> {
                        for (int p : e.parts()) {
                            Long start = owned.remove(p);
                            if (start == null) {
                                throw new Failure(m.name + ": " + e.ev + " of partition " + p + " it did not own (" + e + ")");
                            }
                            o.intervals.add(new Interval(m.name, p, start, e.t));
                        }
                    }
                    case "closed" -> {
                        for (var en : owned.entrySet()) {
                            o.intervals.add(new Interval(m.name, en.getKey(), en.getValue(), e.t));
                        }
                        owned.clear();
                        closed = true;
                    }
                    default -> {
                    }
                }
            }
            Long killed = m.killedAt;
            long end = killed != null ? killed : Long.MAX_VALUE;
            for (var en : owned.entrySet()) {
                o.intervals.add(new Interval(m.name, en.getKey(), en.getValue(), end));
            }
            o.now.put(m.name, killed != null || closed ? new TreeSet<>() : new TreeSet<>(owned.keySet()));
        }
        return o;
    }

    /**
     * Null when at every moment each partition had at most one owner and each record was consumed
     * by the owner of its partition at that moment; else what went wrong.
     */
    static String singleOwnerProblem(List<Member> ms) {
        Ownership o;
        try {
            o = ownership(ms);
        } catch (Failure f) {
            return f.getMessage();
        }
        Map<Integer, List<Interval>> byP = new TreeMap<>();
        for (Interval i : o.intervals) {
            byP.computeIfAbsent(i.p(), k -> new ArrayList<>()).add(i);
        }
        for (var e : byP.entrySet()) {
            List<Interval> spans = e.getValue();
            spans.sort(Comparator.comparingLong(Interval::start));
            for (int i = 1; i < spans.size(); i++) {
                Interval a = spans.get(i - 1);
                Interval b = spans.get(i);
                if (b.start() < a.end()) {
                    return "partition " + e.getKey() + " had two owners: " + a.member() + " from " + secs(a.start()) + " to "
                        + (a.end() == Long.MAX_VALUE ? "the end" : secs(a.end())) + " and " + b.member() + " from " + secs(b.start());
                }
            }
        }
        for (Rec r : consumed(ms)) {
            boolean owned = false;
            for (Interval i : byP.getOrDefault(r.p(), List.of())) {
                if (i.member().equals(r.member()) && i.start() <= r.t() && r.t() <= i.end()) {
                    owned = true;
                    break;
                }
            }
            if (!owned) {
                return r.member() + " consumed " + r.p() + "@" + r.o() + " at " + secs(r.t()) + " without owning partition " + r.p();
            }
        }
        return null;
    }

    /**
     * Every consumed record is the one acknowledged at its offset and none was damaged; returns how
     * often each (partition, offset) was consumed.
     */
    static Map<Long, Integer> checkRecords(List<Member> ms, Map<Long, Long> at) {
        List<Event> damaged = new ArrayList<>();
        for (Event e : allEvents(ms)) {
            if (e.ev.equals("damaged")) {
                damaged.add(e);
            }
        }
        if (!damaged.isEmpty()) {
            throw new Failure("members read damaged records: " + damaged.subList(0, Math.min(5, damaged.size())));
        }
        Map<Long, Integer> counts = new HashMap<>();
        for (Rec r : consumed(ms)) {
            long k = key(r.p(), r.o());
            Long want = at.get(k);
            if (want == null || want != r.seq()) {
                throw new Failure(r.member() + " read seq " + r.seq() + " at " + r.p() + "@" + r.o() + ", acknowledged there was " + want);
            }
            counts.merge(k, 1, Integer::sum);
        }
        return counts;
    }

    static String nothingLost(Map<Long, Integer> counts, Map<Long, Long> at) {
        List<Long> missing = new ArrayList<>();
        for (long k : at.keySet()) {
            if (!counts.containsKey(k)) {
                missing.add(k);
            }
        }
        if (missing.isEmpty()) {
            return null;
        }
        Collections.sort(missing);
        return missing.size() + " of " + at.size() + " records never consumed, e.g. " + missing.stream().limit(5).map(GroupTest::tp).toList();
    }

    static String exactlyOnce(Map<Long, Integer> counts, Map<Long, Long> at) {
        String lost = nothingLost(counts, at);
        if (lost != null) {
            return lost;
        }
        List<Long> twice = new ArrayList<>();
        for (var e : counts.entrySet()) {
            if (e.getValue() > 1) {
                twice.add(e.getKey());
            }
        }
        Collections.sort(twice);
        return twice.isEmpty() ? null
            : twice.size() + " records consumed more than once, e.g. " + twice.stream().limit(5).map(GroupTest::tp).toList();
    }

    static List<Event> commitFailures(List<Member> ms) {
        List<Event> out = new ArrayList<>();
        for (Event e : allEvents(ms)) {
            if (e.ev.equals("commit_failed")) {
                out.add(e);
            }
        }
        return out;
    }

    /**
     * Null when every non-empty assignment came with a generation (classic) or member epoch
     * (KIP-848) above 0, as the client's groupMetadata() reported it in onPartitionsAssigned. A
     * KIP-848 member the broker gives partitions at member epoch 0 commits without its member id
     * and epoch, which the coordinator rightly refuses (UNKNOWN_MEMBER_ID).
     */
    static String assignedWithoutEpoch(List<Member> ms) {
        List<Event> bad = new ArrayList<>();
        for (Event e : allEvents(ms)) {
            if (e.ev.equals("assign") && !e.parts().isEmpty() && e.f.length > 1 && Integer.parseInt(e.f[1]) <= 0) {
                bad.add(e);
            }
        }
        return bad.isEmpty() ? null : bad.size() + " assignments without an epoch, first: " + bad.subList(0, Math.min(3, bad.size()));
    }

    /**
     * Null when every commit succeeded, except a consumer-protocol batch commit sent just before a
     * heartbeat answer bumped the member epoch: it arrives with the old epoch and is refused
     * STALE_MEMBER_EPOCH, as Kafka's coordinator refuses it, and a later commit covers it.
     */
    static String commitsSucceeded(List<Member> ms) {
        List<Event> f = new ArrayList<>();
        for (Event e : commitFailures(ms)) {
            if (!(e.where().equals("batch") && staleEpoch(e))) {
                f.add(e);
            }
        }
        return f.isEmpty() ? null : f.size() + " commits failed, first: " + f.subList(0, Math.min(3, f.size()));
    }

    static boolean staleEpoch(Event e) {
        return e.error().startsWith("CommitFailedException") && e.error().contains("stale member epoch");
    }

    /** The highest offset committed (and acknowledged) per partition, -1 where none. */
    static Map<Integer, Long> committedMax(List<Member> ms) {
        Map<Integer, Long> best = new TreeMap<>();
        for (int p = 0; p < PARTITIONS; p++) {
            best.put(p, -1L);
        }
        for (Event e : allEvents(ms)) {
            if (e.ev.equals("committed")) {
                e.offsets().forEach((p, o) -> best.merge(p, o, Math::max));
            }
        }
        return best;
    }

    static boolean truthy(Object o) {
        return o != null && !Boolean.FALSE.equals(o);
    }

    static <T> T waitUntil(String what, Supplier<T> pred, List<Member> ms, long timeoutMs, long pollMs) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        while (true) {
            for (Member m : ms) {
                m.checkAlive();
            }
            T r = pred.get();
            if (truthy(r)) {
                return r;
            }
            if (System.nanoTime() > deadline) {
                StringBuilder sb = new StringBuilder("timed out after " + timeoutMs / 1000 + " s waiting for " + what);
                if (!ms.isEmpty()) {
                    sb.append("; members own ").append(ownership(ms).now).append(", committed ").append(committedMax(ms));
                    for (Member m : ms) {
                        sb.append("; ").append(m.name).append(" last: ").append(m.last());
                    }
                }
                throw new Failure(sb.toString());
            }
            Thread.sleep(pollMs);
        }
    }

    /**
     * What each live member owns, once every partition has exactly one live owner and the counts
     * differ by at most one; else null.
     */
    static Map<String, Set<Integer>> balanced(List<Member> ms, List<Member> live) {
        Ownership o = ownership(ms);
        List<Integer> all = new ArrayList<>();
        int min = Integer.MAX_VALUE;
        int max = 0;
        Map<String, Set<Integer>> out = new TreeMap<>();
        for (Member m : live) {
            Set<Integer> s = o.now.get(m.name);
            all.addAll(s);
            min = Math.min(min, s.size());
            max = Math.max(max, s.size());
            out.put(m.name, s);
        }
        Collections.sort(all);
        List<Integer> want = new ArrayList<>();
        for (int p = 0; p < PARTITIONS; p++) {
            want.add(p);
        }
        return all.equals(want) && max - min <= 1 ? out : null;
    }

    static boolean allCommitted(List<Member> ms, Map<Integer, Long> ends) {
        Map<Integer, Long> best = committedMax(ms);
        for (var e : ends.entrySet()) {
            if (best.getOrDefault(e.getKey(), -1L) < e.getValue()) {
                return false;
            }
        }
        return true;
    }

    /** Once the feeder is done: whether the members committed the end of every partition. */
    static Supplier<Boolean> allCommitted(List<Member> ms, Feeder f, AtomicReference<Map<Integer, Long>> ends) {
        return () -> {
            if (ends.get() == null) {
                if (f.isAlive()) {
                    return false;
                }
                try {
                    ends.set(endsOf(f.result(), PARTITIONS));
                } catch (InterruptedException e) {
                    throw new Failure("interrupted");
                }
            }
            return allCommitted(ms, ends.get());
        };
    }

    static void stopAll(List<Member> ms) throws Exception {
        for (Member m : ms) {
            if (m.killedAt == null) {
                m.requestStop();
            }
        }
        for (Member m : ms) {
            if (m.killedAt == null) {
                m.waitStopped(40);
            }
        }
    }

    // ---------------------------------------------------------------- admin and plain clients

    static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        return Admin.create(p);
    }

    static void createTopic(Admin admin, String topic, int partitions) throws Exception {
        admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get(30, TimeUnit.SECONDS);
    }

    /** The group's committed offsets (OffsetFetch through Admin), -1 where there is none. */
    static Map<Integer, Long> groupOffsets(Admin admin, String group, String topic, int partitions) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> got = admin.listConsumerGroupOffsets(group)
            .partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
        Map<Integer, Long> out = new TreeMap<>();
        for (int p = 0; p < partitions; p++) {
            OffsetAndMetadata om = got.get(new TopicPartition(topic, p));
            out.put(p, om == null ? -1L : om.offset());
        }
        return out;
    }

    /** The broker's view (DescribeGroups, or ConsumerGroupDescribe): state, and by client.id the assignment. */
    static Map.Entry<GroupState, Map<String, Set<Integer>>> brokerView(Admin admin, String group) throws Exception {
        ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group)).all().get(20, TimeUnit.SECONDS).get(group);
        Map<String, Set<Integer>> m = new TreeMap<>();
        for (MemberDescription md : d.members()) {
            Set<Integer> s = new TreeSet<>();
            for (TopicPartition tp : md.assignment().topicPartitions()) {
                s.add(tp.partition());
            }
            m.put(md.clientId(), s);
        }
        return Map.entry(d.groupState(), m);
    }

    /** Null once the broker reports the group Stable with the members' own assignment (15 s at most). */
    static String brokerAgrees(Admin admin, String group, Map<String, Set<Integer>> expected, List<Member> ms) throws InterruptedException {
        AtomicReference<Object> last = new AtomicReference<>();
        try {
            waitUntil("the broker's description to match", () -> {
                try {
                    var v = brokerView(admin, group);
                    last.set(v);
                    return v.getKey() == GroupState.STABLE && v.getValue().equals(expected);
                } catch (Exception e) {
                    last.set(e);
                    return false;
                }
            }, ms, 15_000, 250);
            return null;
        } catch (Failure f) {
            return "the broker says " + last.get() + ", the members logged " + expected;
        }
    }

    static KafkaConsumer<String, String> groupConsumer(String bootstrap, String group) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, String.valueOf(CLASSIC_SESSION_MS));
        p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, String.valueOf(CLASSIC_HEARTBEAT_MS));
        return new KafkaConsumer<>(p);
    }

    /**
     * Subscribes and reads until every partition delivered the record before {@code until};
     * returns the offsets read per partition, in order.
     */
    static Map<Integer, List<Long>> readSubscribed(KafkaConsumer<String, String> c, String topic, Map<Integer, Long> until,
                                                   Map<Long, Long> at) {
        c.subscribe(List.of(topic));
        Map<Integer, List<Long>> read = new TreeMap<>();
        Set<Integer> pending = new TreeSet<>();
        for (var e : until.entrySet()) {
            read.put(e.getKey(), new ArrayList<>());
            if (e.getValue() > 0) {
                pending.add(e.getKey());
            }
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (!pending.isEmpty()) {
            if (System.nanoTime() > deadline) {
                throw new Failure("timed out reading " + topic + "; still waiting for partitions " + pending);
            }
            for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                Long want = at.get(key(r.partition(), r.offset()));
                if (want == null || !GroupMember.valueOf(want).equals(r.value())) {
                    throw new Failure("read " + r.value() + " at " + r.partition() + "@" + r.offset() + ", acknowledged there was seq " + want);
                }
                read.computeIfAbsent(r.partition(), k -> new ArrayList<>()).add(r.offset());
                if (r.offset() >= until.getOrDefault(r.partition(), 0L) - 1) {
                    pending.remove(r.partition());
                }
            }
        }
        return read;
    }

    static List<Long> range(long from, long to) {
        List<Long> l = new ArrayList<>();
        for (long o = from; o < to; o++) {
            l.add(o);
        }
        return l;
    }

    static Map<TopicPartition, OffsetAndMetadata> commitMap(String topic, Map<Integer, Long> offsets) {
        Map<TopicPartition, OffsetAndMetadata> m = new HashMap<>();
        offsets.forEach((p, o) -> m.put(new TopicPartition(topic, p), new OffsetAndMetadata(o)));
        return m;
    }

    /** Runs a command, output and error together; [exit status, output]. */
    static Map.Entry<Integer, String> run(Path dir, String name, List<String> cmd, long timeoutS) throws Exception {
        Path out = dir.resolve(name + ".out");
        ProcessBuilder pb = new ProcessBuilder(cmd);
        pb.redirectErrorStream(true);
        pb.redirectOutput(out.toFile());
        pb.redirectInput(ProcessBuilder.Redirect.from(new java.io.File("/dev/null")));
        Process p = pb.start();
        try {
            if (!p.waitFor(timeoutS, TimeUnit.SECONDS)) {
                throw new Failure(String.join(" ", cmd.subList(Math.max(0, cmd.size() - 8), cmd.size()))
                    + " did not finish within " + timeoutS + " s");
            }
            return Map.entry(p.exitValue(), Files.readString(out, StandardCharsets.UTF_8));
        } finally {
            if (p.isAlive()) {
                p.destroyForcibly();
                p.waitFor(10, TimeUnit.SECONDS);
            }
        }
    }

    // ---------------------------------------------------------------- 1: three members, nothing fails

    private void threeMembers(Scenario s, String b, String protocol) throws Exception {
        String topic = "three-" + protocol;
        String group = "three-" + protocol;
        List<String> config = protocol.equals("classic") ? CLASSIC : CONSUMER;
        try (Admin admin = admin(b)) {
            createTopic(admin, topic, PARTITIONS);
            // The last third of the stream waits until all three members own partitions.
            Feeder feeder = new Feeder(b, topic, 0, STREAM, RATE, STREAM * 2 / 3);
            List<Member> ms = new ArrayList<>();
            // Commit on revoke in any case, as applications commonly do: with the eager protocol
            // that commit reaches the broker while the group prepares the rebalance.
            ms.add(s.member("m0", b, group, topic, config, 0, "always"));
            feeder.start();
            // The others join while the stream flows, one rebalance each.
            for (String name : List.of("m1", "m2")) {
                Thread.sleep(1000);
                ms.add(s.member(name, b, group, topic, config, 0, "always"));
            }
            waitUntil("one owner per partition, two each", () -> balanced(ms, ms), ms, STABLE_MS, 250);
            feeder.release();
            AtomicReference<Map<Integer, Long>> ends = new AtomicReference<>();
            waitUntil("every record committed", allCommitted(ms, feeder, ends), ms, DONE_MS, 250);
            Map<String, Set<Integer>> fin = waitUntil("one owner per partition, two each", () -> balanced(ms, ms), ms, STABLE_MS, 250);
            s.check("the broker describes the members' own assignment, Stable", brokerAgrees(admin, group, fin, ms));
            Map<Long, Long> at = feeder.result();
            s.checkEquals("Admin.listConsumerGroupOffsets gives the end offsets", ends.get(), groupOffsets(admin, group, topic, PARTITIONS));
            stopAll(ms);

            s.check("each partition has one owner at a time; records consumed only by their owner", singleOwnerProblem(ms));
            List<Integer> sizes = new ArrayList<>();
            fin.values().forEach(v -> sizes.add(v.size()));
            s.checkEquals("final assignment: 2 partitions each", List.of(2, 2, 2), sizes);
            Map<String, Integer> per = new TreeMap<>();
            for (Rec r : consumed(ms)) {
                per.merge(r.member(), 1, Integer::sum);
            }
            s.check("every member consumed records", per.size() == 3 ? null : "records per member: " + per);
            s.check("partitions are only assigned with a generation or member epoch > 0", assignedWithoutEpoch(ms));
            s.check("every commit succeeded", commitsSucceeded(ms));
            Map<Long, Integer> counts = checkRecords(ms, at);
            s.check(STREAM + " records consumed exactly once", exactlyOnce(counts, at));
            s.note("records per member " + per + ", final assignment " + fin);
        }
    }

    // ---------------------------------------------------------------- 2 and 4: a member killed with SIGKILL

    private void killed(Scenario s, String b, String protocol) throws Exception {
        boolean classic = protocol.equals("classic");
        String topic = "kill-" + protocol;
        String group = "kill-" + protocol;
        List<String> config = classic ? CLASSIC : CONSUMER;
        long sessionMs = classic ? CLASSIC_SESSION_MS : CONSUMER_SESSION_MS;
        long heartbeatMs = classic ? CLASSIC_HEARTBEAT_MS : CONSUMER_HEARTBEAT_MS;
        try (Admin admin = admin(b)) {
            createTopic(admin, topic, PARTITIONS);
            List<Member> survivors = List.of(s.member("s0", b, group, topic, config, 0, "pending"),
                s.member("s1", b, group, topic, config, 0, "pending"));
            // The victim waits between logging a batch and committing it, so that the kill can
            // land between the two: that batch was consumed but not committed.
            Member victim = s.member("victim", b, group, topic, config, 250, "pending");
            List<Member> ms = new ArrayList<>(survivors);
            ms.add(victim);
            waitUntil("three members with two partitions each", () -> balanced(ms, ms), ms, STABLE_MS, 250);
            Feeder feeder = new Feeder(b, topic, 0, STREAM, RATE, -1);
            feeder.start();
            // Late in the stream (the victim, slower, is behind), between a batch and its commit.
            waitUntil("the victim between a batch and its commit", () -> {
                Event l = victim.last();
                return feeder.sent >= STREAM * 6 / 10 && l != null && l.ev.equals("consumed");
            }, ms, 60_000, 5);
            long tKill = victim.kill();
            Set<Integer> victimParts = new TreeSet<>();
            for (Event e : victim.events()) {
                if (e.ev.equals("assign")) {
                    victimParts.addAll(e.parts());
                } else if (e.ev.equals("revoke") || e.ev.equals("lost")) {
                    victimParts.removeAll(e.parts());
                }
            }
            if (victimParts.size() != 2) {
                throw new Failure("the victim owned " + victimParts + " when killed");
            }
            // Nobody owns the victim's partitions until its session expires: what is committed for
            // them now is the victim's last commit.
            Thread.sleep(500);
            Map<Integer, Long> atDeath = groupOffsets(admin, group, topic, PARTITIONS);

            AtomicReference<Map<Integer, Long>> ends = new AtomicReference<>();
            waitUntil("every record committed", allCommitted(ms, feeder, ends), ms, sessionMs + DONE_MS, 250);
            Map<String, Set<Integer>> fin = waitUntil("the survivors owning every partition",
                () -> balanced(ms, survivors), ms, STABLE_MS, 250);
            s.check("the broker describes the survivors' own assignment, Stable", brokerAgrees(admin, group, fin, ms));
            Map<Long, Long> at = feeder.result();
            stopAll(ms);

            s.check("each partition has one owner at a time; records consumed only by their owner", singleOwnerProblem(ms));
            Map<Long, Integer> counts = checkRecords(ms, at);

            // The victim's partitions moved to the survivors, not before its session could expire.
            Event move = null;
            for (Event e : allEvents(survivors)) {
                if (e.ev.equals("assign") && e.t > tKill && !Collections.disjoint(e.parts(), victimParts)) {
                    move = e;
                    break;
                }
            }
            if (move == null) {
                s.fail("the victim's partitions move to survivors after the session timeout", "they never moved");
            } else {
                double delay = (move.t - tKill) / 1e9;
                double low = (sessionMs - 2 * heartbeatMs - 500) / 1000.0;
                double high = (sessionMs + 20_000) / 1000.0;
                s.note(String.format("the victim's partitions %s moved %.1f s after the kill", victimParts, delay));
                s.check("the victim's partitions move to survivors after the session timeout (" + sessionMs / 1000 + " s)",
                    delay >= low && delay <= high ? null : String.format("moved %.1f s after the kill", delay));
            }
            Set<Integer> survivorsOwn = new TreeSet<>();
            fin.values().forEach(survivorsOwn::addAll);
            s.check("the survivors own all 6 partitions", survivorsOwn.size() == PARTITIONS ? null : "they own " + fin);

            // What was committed for them is what the victim last committed (or had in flight).
            Map<Integer, Long> survivorsMax = committedMax(survivors);
            String why = null;
            for (int p : victimParts) {
                Long lastOk = null;
                Long inFlight = null;
                for (Event e : victim.events()) {
                    if (e.ev.equals("committed") && e.offsets().containsKey(p)) {
                        lastOk = e.offsets().get(p);
                    }
                    if (e.ev.equals("committing") && e.offsets().containsKey(p)) {
                        inFlight = e.offsets().get(p);
                    }
                }
                Set<Long> allowed = new TreeSet<>();
                if (lastOk != null) {
                    allowed.add(lastOk);
                }
                if (inFlight != null) {
                    allowed.add(inFlight);
                }
                if (allowed.isEmpty()) {
                    allowed.add(survivorsMax.get(p));
                }
                if (!allowed.contains(atDeath.get(p))) {
                    why = "partition " + p + ": committed " + atDeath.get(p) + " after the kill; the victim logged " + allowed;
                }
            }
            s.check("the committed offsets of the victim's partitions are its last commit", why);

            // The new owners start exactly at that commit.
            why = null;
            for (int p : victimParts) {
                long start = Math.max(0, atDeath.get(p));
                Long first = null;
                long min = Long.MAX_VALUE;
                for (Rec r : consumed(survivors)) {
                    if (r.p() == p && r.t() > tKill) {
                        if (first == null) {
                            first = r.o();
                        }
                        min = Math.min(min, r.o());
                    }
                }
                if (first == null) {
                    why = "nobody consumed partition " + p + " after the kill";
                } else if (first != start || min != start) {
                    why = "partition " + p + ": the new owner started at " + first + " (lowest " + min + "), the commit was " + start;
                }
            }
            s.check("the new owners start exactly at the victim's last commit", why);
            s.check("nothing lost", nothingLost(counts, at));

            // Only what the victim consumed after its last commit was consumed again.
            Set<Long> uncommitted = new TreeSet<>();
            for (Rec r : victim.records()) {
                if (victimParts.contains(r.p()) && r.o() >= atDeath.get(r.p())) {
                    uncommitted.add(key(r.p(), r.o()));
                }
            }
            Set<Long> twice = new TreeSet<>();
            List<String> wrong = new ArrayList<>();
            for (var e : counts.entrySet()) {
                if (e.getValue() > 1) {
                    twice.add(e.getKey());
                    if (e.getValue() > 2 || !uncommitted.contains(e.getKey())) {
                        wrong.add(tp(e.getKey()) + " x" + e.getValue());
                    }
                }
            }
            s.check("redelivered: only the victim's records after its last commit, once more",
                !wrong.isEmpty() ? "consumed again although committed, or more than twice: " + wrong.subList(0, Math.min(10, wrong.size()))
                    : !twice.equals(uncommitted) ? twice.size() + " records consumed twice; the victim consumed " + uncommitted.size()
                        + " after its last commit"
                    : twice.isEmpty() ? "the kill landed between a batch and its commit, so that batch must be consumed again" : null);
            s.note(twice.size() + " records the victim consumed after its last commit were consumed again");
            s.check("partitions are only assigned with a generation or member epoch > 0", assignedWithoutEpoch(ms));
            s.check("every commit succeeded", commitsSucceeded(ms));
        }
    }

    // ---------------------------------------------------------------- 3 and 4: a member joins under load

    private void joinUnderLoad(Scenario s, String b, String protocol) throws Exception {
        String topic = "join-" + protocol;
        String group = "join-" + protocol;
        List<String> config = protocol.equals("cooperative") ? COOPERATIVE : CONSUMER;
        try (Admin admin = admin(b)) {
            createTopic(admin, topic, PARTITIONS);
            List<Member> first = List.of(s.member("m0", b, group, topic, config, 0, "pending"),
                s.member("m1", b, group, topic, config, 0, "pending"));
            Map<String, Set<Integer>> before = waitUntil("two members with three partitions each",
                () -> balanced(first, first), first, STABLE_MS, 250);
            // The last third of the stream waits until the newcomer owns partitions.
            Feeder feeder = new Feeder(b, topic, 0, STREAM, RATE, STREAM * 2 / 3);
            feeder.start();
            waitUntil("both members consuming", () -> {
                Set<String> who = new HashSet<>();
                List<Rec> rs = consumed(first);
                rs.forEach(r -> who.add(r.member()));
                return who.size() == 2 && rs.size() >= 3000;
            }, first, 30_000, 100);
            long tJoin = System.nanoTime();
            Member newcomer = s.member("m2", b, group, topic, config, 0, "pending");
            List<Member> ms = new ArrayList<>(first);
            ms.add(newcomer);
            waitUntil("three members with two partitions each", () -> balanced(ms, ms), ms, STABLE_MS, 250);
            feeder.release();
            AtomicReference<Map<Integer, Long>> ends = new AtomicReference<>();
            waitUntil("every record committed", allCommitted(ms, feeder, ends), ms, DONE_MS, 250);
            Map<String, Set<Integer>> fin = waitUntil("three members with two partitions each", () -> balanced(ms, ms), ms, STABLE_MS, 250);
            s.check("the broker describes the members' own assignment, Stable", brokerAgrees(admin, group, fin, ms));
            Map<Long, Long> at = feeder.result();
            stopAll(ms);
            long stopping = Long.MAX_VALUE;
            for (Event e : allEvents(ms)) {
                if (e.ev.equals("stopping")) {
                    stopping = Math.min(stopping, e.t);
                }
            }

            s.check("each partition has one owner at a time; records consumed only by their owner", singleOwnerProblem(ms));
            Set<Integer> moved = fin.get("m2");
            Set<Integer> gone = new TreeSet<>();
            String why = null;
            for (String m : List.of("m0", "m1")) {
                if (!before.get(m).containsAll(fin.get(m))) {
                    why = m + " gained partitions: " + before.get(m) + " -> " + fin.get(m);
                }
                Set<Integer> lost = new TreeSet<>(before.get(m));
                lost.removeAll(fin.get(m));
                gone.addAll(lost);
            }
            if (why == null && !gone.equals(moved)) {
                why = "the old members gave up " + gone + ", the newcomer owns " + moved;
            }
            if (why == null && moved.size() != 2) {
                why = "final assignment " + fin;
            }
            s.check("the newcomer takes 2 partitions, the old members keep the rest of theirs", why);
            s.note("before the join " + before + ", after " + fin);

            // Every revocation while the newcomer joined lists only partitions that moved to it,
            // never everything the member owned; the old members gain nothing.
            Map<String, Set<Integer>> owned = new TreeMap<>();
            before.forEach((m, ps) -> owned.put(m, new TreeSet<>(ps)));
            List<String> revokes = new ArrayList<>();
            why = null;
            for (Event e : allEvents(first)) {
                boolean ownershipEvent = e.ev.equals("assign") || e.ev.equals("revoke") || e.ev.equals("lost");
                if (!ownershipEvent || e.t <= tJoin || e.t >= stopping || e.parts().isEmpty()) {
                    continue;
                }
                if (e.ev.equals("lost")) {
                    why = e.member + " lost partitions " + e.parts();
                } else if (e.ev.equals("assign")) {
                    why = e.member + " was assigned " + e.parts() + " after the join";
                } else if (e.ev.equals("revoke")) {
                    revokes.add(e.member + " " + e.parts());
                    if (!moved.containsAll(e.parts())) {
                        why = e.member + " revoked " + e.parts() + "; only " + moved + " moved to the newcomer";
                    } else if (e.parts().equals(owned.get(e.member))) {
                        why = e.member + " revoked all of its partitions " + e.parts();
                    }
                    owned.get(e.member).removeAll(e.parts());
                }
            }
            if (why == null && revokes.isEmpty()) {
                why = "the old members never revoked anything for the newcomer";
            }
            s.check("onPartitionsRevoked only ever lists partitions that moved to the newcomer", why);
            s.note("revoked after the join: " + revokes);
            // Before the join too, a revocation only handed partitions to the other first member.
            why = null;
            for (Event e : allEvents(first)) {
                if (e.ev.equals("revoke") && e.t < tJoin) {
                    String other = e.member.equals("m0") ? "m1" : "m0";
                    if (!before.get(other).containsAll(e.parts())) {
                        why = e.member + " revoked " + e.parts() + " before the join";
                    }
                }
            }
            s.check("before the join, revocations only moved partitions to the second member", why);

            Map<Long, Integer> counts = checkRecords(ms, at);
            s.check("nothing lost", nothingLost(counts, at));
            s.check("the newcomer consumed records", newcomer.records().isEmpty() ? "it consumed nothing" : null);
            // Partitions that stayed put were consumed exactly once. A moved one again only from
            // the last commit its old owner had acknowledged before the move, where the newcomer started.
            why = null;
            for (var e : counts.entrySet()) {
                if (e.getValue() > 2 || (e.getValue() > 1 && !moved.contains(partOf(e.getKey())))) {
                    why = tp(e.getKey()) + " consumed " + e.getValue() + " times";
                    break;
                }
            }
            int again = 0;
            for (int p : moved) {
                if (why != null) {
                    break;
                }
                long tMove = Long.MAX_VALUE;
                for (Event e : newcomer.events()) {
                    if (e.ev.equals("assign") && e.parts().contains(p)) {
                        tMove = Math.min(tMove, e.t);
                    }
                }
                long start = 0;
                for (Event e : allEvents(first)) {
                    if (e.ev.equals("committed") && e.t < tMove && e.offsets().containsKey(p)) {
                        start = Math.max(start, e.offsets().get(p));
                    }
                }
                Long mine = null;
                for (Rec r : newcomer.records()) {
                    if (r.p() == p) {
                        mine = r.o();
                        break;
                    }
                }
                if (mine == null || mine != start) {
                    why = "partition " + p + ": the newcomer started at " + mine + ", the last commit was " + start;
                    break;
                }
                Set<Long> twiceHere = new TreeSet<>();
                for (var e : counts.entrySet()) {
                    if (partOf(e.getKey()) == p && e.getValue() > 1) {
                        twiceHere.add(e.getKey());
                    }
                }
                Set<Long> oldAfter = new TreeSet<>();
                for (Rec r : consumed(first)) {
                    if (r.p() == p && r.o() >= start) {
                        oldAfter.add(key(r.p(), r.o()));
                    }
                }
                if (!twiceHere.equals(oldAfter)) {
                    why = "partition " + p + ": " + twiceHere.size() + " consumed twice, the old owner consumed " + oldAfter.size()
                        + " at or after the commit " + start;
                }
                again += twiceHere.size();
            }
            s.check("unmoved partitions consumed exactly once; a moved one resumes at its last commit", why);
            // A cooperative member keeps consuming during a rebalance, and the Java client refuses
            // a commit while it rejoins (RebalanceInProgressException) without sending it; a
            // consumer-protocol commit sent just before a heartbeat answer bumps the member epoch
            // arrives with the old epoch and is refused STALE_MEMBER_EPOCH, as Kafka's coordinator
            // refuses it (a received epoch below the member's). Both harmless: a later commit
            // covers them. Any other failure, and any failed commit in a revoke callback, is a defect.
            List<Event> refused = new ArrayList<>();
            List<Event> otherFailures = new ArrayList<>();
            for (Event e : commitFailures(ms)) {
                boolean rejoining = e.error().startsWith("RebalanceInProgressException") || staleEpoch(e);
                if (e.where().equals("batch") && rejoining) {
                    refused.add(e);
                } else {
                    otherFailures.add(e);
                }
            }
            s.check("partitions are only assigned with a generation or member epoch > 0", assignedWithoutEpoch(ms));
            s.check("commits succeed (but batch commits the client refuses while it rejoins)",
                otherFailures.isEmpty() ? null : otherFailures.size() + " failed, first " + otherFailures.subList(0, Math.min(3, otherFailures.size())));
            s.note(refused.size() + " batch commits refused during the rebalance, " + again + " records consumed twice");
        }
    }

    // ---------------------------------------------------------------- 5: committed offsets survive restarts

    private void restarts(Scenario s) throws Exception {
        Broker broker = new Broker(s.dir.resolve("broker"));
        try {
            broker.start();
            String b = broker.bootstrap();
            String topic = "resume";
            String group = "resume";
            int parts = 4;
            Map<Long, Long> at;
            Map<Integer, Long> targets = new TreeMap<>();
            try (Admin admin = admin(b)) {
                createTopic(admin, topic, parts);
                at = new HashMap<>(produce(b, topic, 0, 8_000));
            }
            Map<Integer, Long> ends = endsOf(at, parts);
            for (int p = 0; p < parts; p++) {
                targets.put(p, ends.get(p) / 3 + 17 * p);
            }
            try (KafkaConsumer<String, String> c = groupConsumer(b, group)) {
                Map<Integer, List<Long>> read = readSubscribed(c, topic, targets, at);
                boolean fromZero = read.values().stream().allMatch(l -> !l.isEmpty() && l.get(0) == 0);
                s.check("a new group starts at the earliest offset", fromZero ? null : "first offsets read: " + read.values().stream()
                    .map(l -> l.isEmpty() ? null : l.get(0)).toList());
                c.commitSync(commitMap(topic, targets), Duration.ofSeconds(20));
            }
            long next = 8_000;
            for (String how : List.of("SIGTERM", "SIGKILL")) {
                try (Admin admin = admin(b)) {
                    s.checkEquals("committed before the " + how, targets, groupOffsets(admin, group, topic, parts));
                }
                if (how.equals("SIGTERM")) {
                    s.checkEquals("the broker exits 0 on SIGTERM", 0, broker.stop());
                } else {
                    broker.kill();
                }
                broker.start();
                try (Admin admin = admin(b)) {
                    s.checkEquals("after a " + how + " restart: Admin.listConsumerGroupOffsets as committed", targets,
                        groupOffsets(admin, group, topic, parts));
                }
                try (KafkaConsumer<String, String> c = groupConsumer(b, group)) {
                    Set<TopicPartition> tps = new HashSet<>();
                    for (int p = 0; p < parts; p++) {
                        tps.add(new TopicPartition(topic, p));
                    }
                    Map<Integer, Long> seen = new TreeMap<>();
                    c.committed(tps, Duration.ofSeconds(20)).forEach((tp, om) -> seen.put(tp.partition(), om == null ? -1 : om.offset()));
                    s.checkEquals("after a " + how + " restart: KafkaConsumer.committed as committed", targets, seen);
                }
                // More records after the restart: the resumed consumer reads across the old end too.
                at.putAll(produce(b, topic, next, 2_000));
                next += 2_000;
                Map<Integer, Long> newEnds = endsOf(at, parts);
                try (KafkaConsumer<String, String> c = groupConsumer(b, group)) {
                    Map<Integer, List<Long>> read = readSubscribed(c, topic, newEnds, at);
                    String why = null;
                    for (int p = 0; p < parts; p++) {
                        if (!read.get(p).equals(range(targets.get(p), newEnds.get(p)))) {
                            List<Long> l = read.get(p);
                            why = "partition " + p + ": read " + l.size() + " records from " + (l.isEmpty() ? null : l.get(0))
                                + ", expected " + targets.get(p) + " up to " + newEnds.get(p) + " without gaps or repeats";
                        }
                    }
                    s.check("after a " + how + " restart: a consumer resumes exactly where the group was", why);
                    // The group moves on; the next restart must keep this.
                    for (int p = 0; p < parts; p++) {
                        targets.put(p, (targets.get(p) + newEnds.get(p)) / 2);
                    }
                    c.commitSync(commitMap(topic, targets), Duration.ofSeconds(20));
                }
            }
            try (Admin admin = admin(b)) {
                s.checkEquals("the last commit", targets, groupOffsets(admin, group, topic, parts));
            }
            s.checkEquals("the restarted broker exits 0 on SIGTERM", 0, broker.stop());
        } finally {
            broker.kill();
        }
    }

    // ---------------------------------------------------------------- 6: two groups, each reads everything

    private void twoGroups(Scenario s, String b) throws Exception {
        String topic = "two-groups";
        try (Admin admin = admin(b)) {
            createTopic(admin, topic, PARTITIONS);
            Feeder feeder = new Feeder(b, topic, 0, 12_000, RATE, -1);
            Map<String, List<Member>> groups = new TreeMap<>();
            groups.put("reader-a", List.of(s.member("a0", b, "reader-a", topic, CLASSIC, 0, "pending"),
                s.member("a1", b, "reader-a", topic, CLASSIC, 0, "pending")));
            groups.put("reader-b", List.of(s.member("b0", b, "reader-b", topic, CONSUMER, 0, "pending"),
                s.member("b1", b, "reader-b", topic, CONSUMER, 0, "pending")));
            List<Member> everyone = new ArrayList<>();
            groups.values().forEach(everyone::addAll);
            for (var g : groups.entrySet()) {
                waitUntil(g.getKey() + " to assign every partition", () -> balanced(g.getValue(), g.getValue()), everyone, STABLE_MS, 250);
            }
            feeder.start();
            for (var g : groups.entrySet()) {
                AtomicReference<Map<Integer, Long>> ends = new AtomicReference<>();
                waitUntil(g.getKey() + " to commit every record", allCommitted(g.getValue(), feeder, ends), everyone, DONE_MS, 250);
            }
            Map<Long, Long> at = feeder.result();
            Map<Integer, Long> ends = endsOf(at, PARTITIONS);
            for (String g : groups.keySet()) {
                s.checkEquals(g + ": committed offsets are the end offsets", ends, groupOffsets(admin, g, topic, PARTITIONS));
            }
            stopAll(everyone);
            for (var g : groups.entrySet()) {
                String name = g.getKey() + (g.getKey().equals("reader-a") ? " (classic)" : " (consumer protocol)");
                s.check(name + ": one owner per partition at a time", singleOwnerProblem(g.getValue()));
                s.check(name + ": partitions only assigned with a generation or member epoch > 0", assignedWithoutEpoch(g.getValue()));
                s.check(name + ": every commit succeeded", commitsSucceeded(g.getValue()));
                s.check(name + ": all 12000 records exactly once", exactlyOnce(checkRecords(g.getValue(), at), at));
            }
        }
    }

    // ---------------------------------------------------------------- 7: reset-offsets

    private void resetOffsets(Scenario s, String b) throws Exception {
        String topic = "reset";
        String group = "resettable";
        int parts = 3;
        try (Admin admin = admin(b)) {
            createTopic(admin, topic, parts);
            Map<Long, Long> at = produce(b, topic, 0, 3_000);
            Map<Integer, Long> ends = endsOf(at, parts);
            if (ends.values().stream().anyMatch(e -> e <= 100)) {
                throw new Failure("a partition has 100 records or fewer: " + ends);
            }
            try (KafkaConsumer<String, String> c = groupConsumer(b, group)) {
                readSubscribed(c, topic, ends, at);
                c.commitSync(commitMap(topic, ends), Duration.ofSeconds(20));
            }
            s.checkEquals("the group committed the ends", ends, groupOffsets(admin, group, topic, parts));

            String classpath = System.getProperty("java.class.path");
            String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
            List<String> kafkaCli = List.of(java, "-XX:TieredStopAtLevel=1", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp", classpath, "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                "--bootstrap-server", b, "--group", group, "--topic", topic, "--reset-offsets");
            List<String> sluiceCli = List.of(sluiceBin.toString(), "group", "reset-offsets", group, "--topic", topic,
                "--bootstrap-server", b);

            record Reset(String name, List<String> cmd, long to) {
            }
            List<Reset> resets = List.of(
                new Reset("kafka-consumer-groups --reset-offsets --to-offset 100 --execute",
                    concat(kafkaCli, "--to-offset", "100", "--execute"), 100),
                new Reset("kafka-consumer-groups --reset-offsets --to-earliest --execute",
                    concat(kafkaCli, "--to-earliest", "--execute"), 0),
                new Reset("sluice group reset-offsets --to-offset 50 --execute",
                    concat(sluiceCli, "--to-offset", "50", "--execute"), 50));
            int n = 0;
            for (Reset r : resets) {
                var res = run(s.dir, "reset-" + n++, r.cmd(), 90);
                s.check(r.name() + ": exit 0", res.getKey() == 0 ? null : "exit " + res.getKey() + ": " + abbreviate(res.getValue()));
                Map<Integer, Long> want = new TreeMap<>();
                for (int p = 0; p < parts; p++) {
                    want.put(p, r.to());
                }
                s.checkEquals(r.name() + ": Admin.listConsumerGroupOffsets", want, groupOffsets(admin, group, topic, parts));
                try (KafkaConsumer<String, String> c = groupConsumer(b, group)) {
                    Map<Integer, List<Long>> read = readSubscribed(c, topic, ends, at);
                    String why = null;
                    for (int p = 0; p < parts; p++) {
                        if (!read.get(p).equals(range(r.to(), ends.get(p)))) {
                            List<Long> l = read.get(p);
                            why = "partition " + p + ": read " + l.size() + " from " + (l.isEmpty() ? null : l.get(0))
                                + ", expected " + r.to() + " up to " + ends.get(p);
                        }
                    }
                    s.check(r.name() + ": a consumer then reads from the reset point", why);
                }
            }

            // With an active member, Kafka's tool refuses to reset, and nothing changes.
            try (KafkaConsumer<String, String> c = groupConsumer(b, group)) {
                readSubscribed(c, topic, ends, at);
                var res = run(s.dir, "reset-active", concat(kafkaCli, "--to-offset", "100", "--execute"), 90);
                s.check("kafka-consumer-groups --reset-offsets with an active member: refused as inactive-only",
                    Pattern.compile("inactive").matcher(res.getValue()).find() ? null : "exit " + res.getKey() + ": " + abbreviate(res.getValue()));
                Map<Integer, Long> want = new TreeMap<>();
                for (int p = 0; p < parts; p++) {
                    want.put(p, 50L);
                }
                s.checkEquals("kafka-consumer-groups --reset-offsets with an active member: offsets unchanged", want,
                    groupOffsets(admin, group, topic, parts));
            }
        }
    }

    static List<String> concat(List<String> a, String... b) {
        List<String> l = new ArrayList<>(a);
        l.addAll(Arrays.asList(b));
        return l;
    }

    static String abbreviate(String s) {
        s = s.replace('\n', '|');
        return s.length() <= 600 ? s : s.substring(0, 600) + "...";
    }
}
