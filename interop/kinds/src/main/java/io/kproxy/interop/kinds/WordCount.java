package io.kproxy.interop.kinds;

import java.util.Arrays;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Produced;

/**
 * Kafka Streams word count for the interop harness, with exactly-once v2:
 * --in lines become counts per word on --out. --protocol picks the group
 * protocol: streams (the default: the streams rebalance protocol, KIP-1071)
 * or classic (JoinGroup/SyncGroup with Streams' own assignor, a 10 s
 * session and 1 s heartbeats, so a killed instance's tasks move in seconds
 * rather than after the 45 s default). It prints "STATE s" on every state
 * change and "ERROR ..." for an uncaught exception, and runs until killed
 * or --seconds pass.
 */
public final class WordCount {
    public static void main(String[] argv) throws InterruptedException {
        Map<String, String> a = Share.args(argv.length > 0 ? withTopic(argv) : argv);
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, a.get("group"));
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
        p.put(StreamsConfig.CLIENT_ID_CONFIG, a.getOrDefault("name", "wordcount"));
        String protocol = a.getOrDefault("protocol", "streams");
        p.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, protocol);
        if (protocol.equals("classic")) {
            p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), "10000");
            p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), "1000");
        }
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.STATE_DIR_CONFIG, a.get("state-dir"));
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "200");
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0");
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());
        StreamsBuilder b = new StreamsBuilder();
        b.<String, String>stream(a.get("in"))
            .flatMapValues(v -> Arrays.asList(v.split(" ")))
            .groupBy((k, w) -> w)
            .count()
            .toStream()
            .to(a.get("out"), Produced.with(Serdes.String(), Serdes.Long()));
        KafkaStreams s = new KafkaStreams(b.build(), p);
        s.setStateListener((now, before) -> System.out.println("STATE " + now));
        s.setUncaughtExceptionHandler(e -> {
            System.out.println("ERROR " + e.getClass().getName() + ": " + e.getMessage());
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        s.start();
        Thread.sleep(1000L * Long.parseLong(a.getOrDefault("seconds", "300")));
        s.close();
        System.out.println("DONE");
    }

    // Share.args requires --topic; the word count names its topics --in
    // and --out, so --topic is --in.
    private static String[] withTopic(String[] argv) {
        for (int i = 0; i + 1 < argv.length; i += 2) {
            if (argv[i].equals("--in")) {
                String[] out = Arrays.copyOf(argv, argv.length + 2);
                out[argv.length] = "--topic";
                out[argv.length + 1] = argv[i + 1];
                return out;
            }
        }
        return argv;
    }
}
