package io.kproxy.interop.kinds;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * A share-group member (KIP-932) for the interop harness: a
 * KafkaShareConsumer of --group on --topic with implicit acknowledgement
 * (each poll accepts the records of the one before). It prints one line per
 * record, "REC partition offset deliveryCount value", then "BATCH n" after
 * each non-empty poll, and holds the batch --hold-ms before polling again, so
 * that the harness can kill it while it holds acquired records. Errors are
 * printed as "ERROR class: message" and the program goes on polling, as an
 * application would; it runs until killed or --seconds pass. On SIGTERM
 * it stops polling, closes the consumer (leaving the group, as an
 * application stopping does) and prints "DONE".
 *
 * <p>With --ack explicit (share.acknowledgement.mode=explicit) it
 * acknowledges each record itself: REJECT when the value ends in 7,
 * RELEASE on the first delivery when it ends in 3, ACCEPT otherwise, then
 * commitSync; for each record of a partition whose acknowledgement was
 * answered without error it prints "ACK ms partition offset type value"
 * (type: accept, release or reject; ms: wall clock after commitSync
 * returned), otherwise "ERROR ack ...".
 * REC lines then end with the wall-clock ms of the poll's return.
 */
public final class Share {
    public static void main(String[] argv) {
        Map<String, String> a = args(argv);
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, a.get("bootstrap"));
        p.put(ConsumerConfig.GROUP_ID_CONFIG, a.get("group"));
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, a.getOrDefault("name", "share"));
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        boolean explicit = "explicit".equals(a.getOrDefault("ack", "implicit"));
        if (explicit) {
            p.put("share.acknowledgement.mode", "explicit");
        }
        long hold = Long.parseLong(a.getOrDefault("hold-ms", "0"));
        long until = System.currentTimeMillis() + 1000L * Long.parseLong(a.getOrDefault("seconds", "120"));
        int batches = 0;
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopping = true;
            try {
                main.join(15_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        try (KafkaShareConsumer<String, String> c = new KafkaShareConsumer<>(p)) {
            c.subscribe(List.of(a.get("topic")));
            System.out.println("STARTED");
            while (!stopping && System.currentTimeMillis() < until) {
                ConsumerRecords<String, String> recs;
                try {
                    recs = c.poll(Duration.ofMillis(500));
                } catch (RuntimeException e) {
                    System.out.println("ERROR " + e.getClass().getName() + ": " + e.getMessage());
                    sleep(500);
                    continue;
                }
                if (recs.isEmpty()) {
                    continue;
                }
                long polled = System.currentTimeMillis();
                StringBuilder b = new StringBuilder();
                for (ConsumerRecord<String, String> r : recs) {
                    b.append("REC ").append(r.partition()).append(' ').append(r.offset()).append(' ')
                        .append(r.deliveryCount().orElse((short) 0)).append(' ').append(r.value());
                    if (explicit) {
                        b.append(' ').append(polled);
                    }
                    b.append('\n');
                }
                b.append("BATCH ").append(++batches);
                System.out.println(b);
                System.out.flush();
                if (explicit) {
                    acknowledge(c, recs);
                }
                sleep(hold);
            }
        }
        System.out.println("DONE");
        System.out.flush();
    }

    /** Set by the SIGTERM hook: the poll loop ends and the consumer closes. */
    static volatile boolean stopping;

    /** The ack type of --ack explicit for a record (see the class comment). */
    static AcknowledgeType ackType(ConsumerRecord<String, String> r) {
        String v = r.value() == null ? "" : r.value();
        if (v.endsWith("7")) {
            return AcknowledgeType.REJECT;
        }
        if (v.endsWith("3") && r.deliveryCount().orElse((short) 0) == 1) {
            return AcknowledgeType.RELEASE;
        }
        return AcknowledgeType.ACCEPT;
    }

    /** Acknowledges recs one by one, commits, and prints the outcome. */
    static void acknowledge(KafkaShareConsumer<String, String> c, ConsumerRecords<String, String> recs) {
        Map<ConsumerRecord<String, String>, AcknowledgeType> types = new java.util.LinkedHashMap<>();
        for (ConsumerRecord<String, String> r : recs) {
            AcknowledgeType t = ackType(r);
            c.acknowledge(r, t);
            types.put(r, t);
        }
        Map<TopicIdPartition, java.util.Optional<KafkaException>> res;
        try {
            res = c.commitSync();
        } catch (RuntimeException e) {
            System.out.println("ERROR ack " + e.getClass().getName() + ": " + e.getMessage());
            return;
        }
        long now = System.currentTimeMillis();
        Map<String, String> answered = new HashMap<>(); // "topic-partition" -> "" or its error
        for (Map.Entry<TopicIdPartition, java.util.Optional<KafkaException>> e : res.entrySet()) {
            answered.put(e.getKey().topic() + "-" + e.getKey().partition(),
                e.getValue().map(x -> x.getClass().getName() + ": " + x.getMessage()).orElse(""));
        }
        StringBuilder b = new StringBuilder();
        for (Map.Entry<ConsumerRecord<String, String>, AcknowledgeType> e : types.entrySet()) {
            ConsumerRecord<String, String> r = e.getKey();
            String tp = r.topic() + "-" + r.partition();
            String err = answered.getOrDefault(tp, "no result for the partition");
            if (!err.isEmpty()) {
                b.append("ERROR ack ").append(tp).append(' ').append(r.offset()).append(' ').append(err).append('\n');
            } else {
                b.append("ACK ").append(now).append(' ').append(r.partition()).append(' ').append(r.offset()).append(' ')
                    .append(e.getValue()).append(' ').append(r.value()).append('\n');
            }
        }
        System.out.print(b);
        System.out.flush();
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    static Map<String, String> args(String[] argv) {
        Map<String, String> m = new HashMap<>();
        for (int i = 0; i + 1 < argv.length; i += 2) {
            if (!argv[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --flag value, got " + argv[i]);
            }
            m.put(argv[i].substring(2), argv[i + 1]);
        }
        for (String need : List.of("bootstrap", "group", "topic")) {
            if (!m.containsKey(need)) {
                throw new IllegalArgumentException("missing --" + need);
            }
        }
        return m;
    }
}
