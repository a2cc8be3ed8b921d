package io.kproxy.interop;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Client is the Java member of the kproxy interop harness. It speaks the
 * harness's JSON-lines protocol on stdout (one object per line) and runs in
 * one of four modes: produce, consume (classic group protocol, commits after
 * every batch), txn (consume-process-produce with transactional offsets) and
 * commit (one OffsetCommit for partition 0 of --topic at --start, as a
 * client outside the group, then exit). --client-props FILE adds client
 * properties (security.protocol, sasl.*, ssl.*) to every client it makes.
 * SIGTERM closes the client cleanly.
 */
public final class Client {
  private final Map<String, String> args;
  private final String member;
  /** owned is the partition set this member holds; touched only by the poll thread. */
  private final TreeSet<Integer> owned = new TreeSet<>();

  private final AtomicBoolean stop = new AtomicBoolean();
  private final CountDownLatch done = new CountDownLatch(1);

  private Client(Map<String, String> args) {
    this.args = args;
    this.member = args.getOrDefault("member", "java");
  }

  public static void main(String[] argv) {
    Map<String, String> args = new HashMap<>();
    for (int i = 0; i + 1 < argv.length; i += 2) {
      if (!argv[i].startsWith("--")) {
        throw new IllegalArgumentException("bad argument " + argv[i]);
      }
      args.put(argv[i].substring(2), argv[i + 1]);
    }
    Client c = new Client(args);
    int rc;
    try {
      rc = c.run();
    } catch (Exception e) {
      c.error(e);
      rc = 1;
    }
    System.out.flush();
    System.exit(rc);
  }

  private int run() throws Exception {
    String mode = args.getOrDefault("mode", "consume");
    switch (mode) {
      case "produce":
        return produce();
      case "consume":
        return consume(false);
      case "txn":
        return consume(true);
      case "commit":
        return commitOnce();
      default:
        throw new IllegalArgumentException("unknown mode " + mode);
    }
  }

  private String arg(String k) {
    String v = args.get(k);
    if (v == null || v.isEmpty()) {
      throw new IllegalArgumentException("missing --" + k);
    }
    return v;
  }

  /** props returns the properties of --client-props, or none. */
  private Properties props() throws java.io.IOException {
    Properties p = new Properties();
    String file = args.get("client-props");
    if (file != null && !file.isEmpty()) {
      try (java.io.Reader r = java.nio.file.Files.newBufferedReader(java.nio.file.Path.of(file))) {
        p.load(r);
      }
    }
    return p;
  }

  /** commitOnce commits --start for partition 0 of --topic as --group, outside the group. */
  private int commitOnce() throws java.io.IOException {
    Properties p = props();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, arg("bootstrap"));
    p.put(ConsumerConfig.GROUP_ID_CONFIG, arg("group"));
    p.put(ConsumerConfig.CLIENT_ID_CONFIG, member);
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    long offset = Long.parseLong(args.getOrDefault("start", "0"));
    try (KafkaConsumer<String, String> c = new KafkaConsumer<>(p)) {
      c.commitSync(Map.of(new TopicPartition(arg("topic"), 0), new OffsetAndMetadata(offset)),
          Duration.ofSeconds(60));
    } catch (Exception e) {
      error(e);
      return 1;
    }
    emit("{\"ev\":\"commit\",\"offsets\":{\"0\":" + offset + "}}");
    return 0;
  }

  private int produce() throws java.io.IOException {
    Properties p = props();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, arg("bootstrap"));
    p.put(ProducerConfig.CLIENT_ID_CONFIG, member);
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    int start = Integer.parseInt(args.getOrDefault("start", "0"));
    int count = Integer.parseInt(arg("count"));
    String topic = arg("topic");
    try (KafkaProducer<String, String> prod = new KafkaProducer<>(p)) {
      List<java.util.concurrent.Future<?>> fs = new ArrayList<>();
      for (int i = start; i < start + count; i++) {
        String id = "id-" + i;
        fs.add(prod.send(new ProducerRecord<>(topic, id, id)));
      }
      prod.flush();
      for (java.util.concurrent.Future<?> f : fs) {
        f.get(30, TimeUnit.SECONDS);
      }
    } catch (Exception e) {
      error(e);
      return 1;
    }
    emit("{\"ev\":\"produced\",\"count\":" + count + "}");
    return 0;
  }

  private int consume(boolean txn) throws java.io.IOException {
    Properties p = props();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, arg("bootstrap"));
    p.put(ConsumerConfig.GROUP_ID_CONFIG, arg("group"));
    p.put(ConsumerConfig.CLIENT_ID_CONFIG, member);
    p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, args.getOrDefault("session-ms", "10000"));
    p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, args.getOrDefault("heartbeat-ms", "1000"));
    p.put(ConsumerConfig.MAX_POLL_INTERVAL_MS_CONFIG, "20000");
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "200");
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    String assignor = args.getOrDefault("assignor", "range");
    if (assignor.startsWith("server-")) {
      // KIP-848: the coordinator assigns; session and heartbeat timing
      // are the group's, and the client may not set them.
      p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
      p.put(ConsumerConfig.GROUP_REMOTE_ASSIGNOR_CONFIG, assignor.substring("server-".length()));
      p.remove(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG);
      p.remove(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG);
    } else switch (assignor) {
      case "range":
        p.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, RangeAssignor.class.getName());
        break;
      case "cooperative-sticky":
        p.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG,
            CooperativeStickyAssignor.class.getName());
        break;
      default:
        throw new IllegalArgumentException("unknown assignor " + assignor);
    }
    String instance = args.get("instance-id");
    if (instance != null && !instance.isEmpty()) {
      p.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, instance);
    }
    KafkaProducer<String, String> prod = null;
    String outTopic = null;
    if (txn) {
      p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
      outTopic = arg("out-topic");
      Properties pp = props();
      pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, arg("bootstrap"));
      pp.put(ProducerConfig.CLIENT_ID_CONFIG, member + "-txn");
      pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, arg("group") + "-" + member);
      pp.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "15000");
      pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
      pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
      prod = new KafkaProducer<>(pp);
      prod.initTransactions();
    }
    KafkaConsumer<String, String> consumer = new KafkaConsumer<>(p);
    Thread main = Thread.currentThread();
    // SIGTERM only sets stop; the poll loop sees it within one poll
    // timeout. consumer.wakeup() is not used: a wakeup that lands in
    // commitSync can leave the batch committed on the broker (the request
    // was already sent) while the retry throws again, so the member exited
    // without printing records it had committed, and the harness counted
    // them lost (seen once on the direct path against Kafka 4.1.1 with the
    // consumer-protocol AsyncKafkaConsumer).
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      stop.set(true);
      try {
        done.await(25, TimeUnit.SECONDS);
      } catch (InterruptedException ignored) {
        Thread.currentThread().interrupt();
      }
    }));
    int rc = 0;
    try {
      consumer.subscribe(List.of(arg("topic")), new ConsumerRebalanceListener() {
        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> parts) {
          int gen = consumer.groupMetadata().generationId();
          for (TopicPartition tp : parts) {
            owned.remove(tp.partition());
          }
          assignment("revoked", gen);
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> parts) {
          int gen = consumer.groupMetadata().generationId();
          for (TopicPartition tp : parts) {
            owned.add(tp.partition());
          }
          assignment("assigned", gen);
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> parts) {
          int gen = consumer.groupMetadata().generationId();
          for (TopicPartition tp : parts) {
            owned.remove(tp.partition());
          }
          assignment("lost", gen);
        }
      });
      emit("{\"ev\":\"ready\",\"member\":\"" + member + "\"}");
      while (!stop.get()) {
        ConsumerRecords<String, String> recs = consumer.poll(Duration.ofMillis(200));
        if (recs.isEmpty()) {
          continue;
        }
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        if (txn) {
          prod.beginTransaction();
        }
        for (ConsumerRecord<String, String> r : recs) {
          if (txn) {
            prod.send(new ProducerRecord<>(outTopic, r.key(), r.value()));
          }
          offsets.put(new TopicPartition(r.topic(), r.partition()),
              new OffsetAndMetadata(r.offset() + 1));
        }
        try {
          if (txn) {
            prod.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
            prod.commitTransaction();
          } else {
            consumer.commitSync(offsets);
          }
        } catch (Exception e) {
          error(e);
          if (txn) {
            prod.abortTransaction();
          }
          replay(consumer, recs);
          continue;
        }
        for (ConsumerRecord<String, String> r : recs) {
          emit("{\"ev\":\"record\",\"p\":" + r.partition() + ",\"o\":" + r.offset()
              + ",\"id\":\"" + r.value() + "\"}");
        }
        StringBuilder sb = new StringBuilder("{\"ev\":\"commit\",\"offsets\":{");
        boolean first = true;
        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets.entrySet()) {
          sb.append(first ? "" : ",").append('"').append(e.getKey().partition()).append("\":")
              .append(e.getValue().offset());
          first = false;
        }
        emit(sb.append("}}").toString());
      }
    } catch (Exception e) {
      error(e);
      rc = 1;
    } finally {
      try {
        consumer.close(Duration.ofSeconds(10));
      } catch (Exception e) {
        error(e);
      }
      if (prod != null) {
        prod.close(Duration.ofSeconds(5));
      }
      emit("{\"ev\":\"closed\",\"member\":\"" + member + "\"}");
      done.countDown();
    }
    return rc;
  }

  /**
   * replay rewinds the partitions of a batch whose commit failed (a
   * rebalance in progress, a fenced epoch) and that this member still owns
   * to the batch's first records, so they are consumed again and printed
   * once a commit covers them, as an at-least-once application does; a
   * partition it lost restarts from the committed offset at its new owner.
   */
  private static void replay(KafkaConsumer<String, String> consumer, ConsumerRecords<String, String> recs) {
    for (TopicPartition tp : recs.partitions()) {
      if (consumer.assignment().contains(tp)) {
        consumer.seek(tp, recs.records(tp).get(0).offset());
      }
    }
  }

  private void assignment(String kind, int generation) {
    StringBuilder sb = new StringBuilder();
    sb.append("{\"ev\":\"").append(kind).append("\",\"member\":\"").append(member)
        .append("\",\"generation\":").append(generation).append(",\"partitions\":[");
    boolean first = true;
    for (int part : owned) {
      sb.append(first ? "" : ",").append(part);
      first = false;
    }
    emit(sb.append("]}").toString());
  }

  private void error(Throwable e) {
    String msg = String.valueOf(e).replace("\\", "\\\\").replace("\"", "'").replace("\n", " ");
    emit("{\"ev\":\"error\",\"member\":\"" + member + "\",\"error\":\"" + msg + "\"}");
  }

  private static synchronized void emit(String json) {
    long ts = System.currentTimeMillis();
    System.out.println("{\"ts\":" + ts + "," + json.substring(1));
    System.out.flush();
  }
}
