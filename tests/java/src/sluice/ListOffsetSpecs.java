package sluice;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.common.TopicPartition;

/**
 * Asks one partition for every kind of offset the Java admin client knows, each in its own
 * ListOffsets request (earliestPendingUpload needs v11, latestTiered v9, earliestLocal v8), and
 * prints one line per kind: name, offset, timestamp, leader epoch (or the error's class).
 *
 * <p>Arguments: bootstrap servers, topic, partition, then timestamps to look up.
 */
public final class ListOffsetSpecs {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        TopicPartition tp = new TopicPartition(args[1], Integer.parseInt(args[2]));
        Map<String, OffsetSpec> specs = new LinkedHashMap<>();
        specs.put("earliest", OffsetSpec.earliest());
        specs.put("latest", OffsetSpec.latest());
        specs.put("maxTimestamp", OffsetSpec.maxTimestamp());
        specs.put("earliestLocal", OffsetSpec.earliestLocal());
        specs.put("latestTiered", OffsetSpec.latestTiered());
        specs.put("earliestPendingUpload", OffsetSpec.earliestPendingUpload());
        for (int i = 3; i < args.length; i++) {
            specs.put("forTimestamp(" + args[i] + ")", OffsetSpec.forTimestamp(Long.parseLong(args[i])));
        }
        try (Admin admin = Admin.create(props)) {
            for (Map.Entry<String, OffsetSpec> e : specs.entrySet()) {
                String line;
                try {
                    ListOffsetsResultInfo info = admin.listOffsets(Map.of(tp, e.getValue())).partitionResult(tp).get();
                    line = info.offset() + " " + info.timestamp() + " " + info.leaderEpoch().map(String::valueOf).orElse("none");
                } catch (java.util.concurrent.ExecutionException error) {
                    line = "error " + error.getCause().getClass().getSimpleName();
                }
                System.out.println(e.getKey() + " " + line);
            }
        }
    }
}
