#!/usr/bin/env python3
"""Python member of the kproxy interop harness.

Drives confluent-kafka (librdkafka) or kafka-python, chosen with --client,
and prints the harness's JSON-lines protocol on stdout: assignment events
carrying the member's full owned partition set, consumed records, commits,
errors and "closed". --mode produce writes --count records with ids
id-<start>..; --mode consume joins --group, commits after every batch and
closes cleanly on SIGTERM. --mode commit (confluent only) commits --start
for partition 0 of --topic as --group from outside the group, then exits.
--mode share (confluent only) is a share-group member (KIP-932,
confluent_kafka.ShareConsumer) that speaks the plain lines of the Java
Share program instead (see confluent_share).
--client-props FILE adds librdkafka properties (key=value lines:
security.protocol, sasl.*, ssl.*) to every confluent-kafka client.
"""
import argparse
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time

_lock = threading.Lock()


def emit(member, ev, **fields):
    """Writes one event line with the wall-clock time in milliseconds."""
    fields.update({"ts": int(time.time() * 1000), "ev": ev, "member": member})
    line = json.dumps(fields)
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--client", required=True, choices=["confluent", "kafka-python"])
    p.add_argument("--mode", default="consume", choices=["produce", "consume", "commit", "share"])
    p.add_argument("--client-props", default="")
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="")
    p.add_argument("--member", default="py")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--assignor", default="range", choices=["range", "cooperative-sticky"])
    p.add_argument("--instance-id", default="")
    p.add_argument("--session-ms", type=int, default=10000)
    p.add_argument("--heartbeat-ms", type=int, default=1000)
    p.add_argument("--hold-ms", type=int, default=0)
    p.add_argument("--ack", default="implicit", choices=["implicit", "explicit"])
    return p.parse_args()


class Stopper:
    """Stopper turns SIGTERM/SIGINT into a flag the poll loop checks."""

    def __init__(self):
        self.stop = False
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, *_):
        self.stop = True


# ---------------------------------------------------------------- confluent-kafka

def client_props(a):
    """The key=value properties of --client-props, or none."""
    props = {}
    if a.client_props:
        with open(a.client_props) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    k, _, v = line.partition("=")
                    props[k.strip()] = v.strip()
    return props


def confluent_commit(a):
    from confluent_kafka import Consumer, TopicPartition
    conf = client_props(a)
    conf.update({"bootstrap.servers": a.bootstrap, "group.id": a.group, "client.id": a.member,
                 "enable.auto.commit": False})
    c = Consumer(conf)
    try:
        res = c.commit(offsets=[TopicPartition(a.topic, 0, a.start)], asynchronous=False)
        for tp in res or []:
            if tp.error is not None:
                raise RuntimeError("commit: %s" % tp.error)
    finally:
        c.close()
    emit(a.member, "commit", offsets={"0": a.start})


def confluent_produce(a):
    from confluent_kafka import Producer
    conf = client_props(a)
    conf.update({"bootstrap.servers": a.bootstrap, "client.id": a.member, "acks": "all", "linger.ms": 5})
    p = Producer(conf)
    failures = []

    def done(err, _msg):
        if err is not None:
            failures.append(str(err))

    for i in range(a.start, a.start + a.count):
        rid = "id-%d" % i
        while True:
            try:
                p.produce(a.topic, key=rid, value=rid, on_delivery=done)
                break
            except BufferError:
                p.poll(0.05)
    left = p.flush(60)
    if left or failures:
        raise RuntimeError("delivery failed: %d undelivered, errors %s" % (left, failures[:3]))


def confluent_consume(a, stopper):
    from confluent_kafka import Consumer, TopicPartition, KafkaException, KafkaError
    COMMIT_RETRY_CODES = (KafkaError._TIMED_OUT, KafkaError._WAIT_COORD, KafkaError._TRANSPORT,
                          KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
                          KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.REQUEST_TIMED_OUT)
    conf = client_props(a)
    conf.update({
        "bootstrap.servers": a.bootstrap,
        "group.id": a.group,
        "client.id": a.member,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": a.session_ms,
        "heartbeat.interval.ms": a.heartbeat_ms,
        "max.poll.interval.ms": 20000,
        "partition.assignment.strategy": a.assignor,
        "group.protocol": "classic",
    })
    if a.instance_id:
        conf["group.instance.id"] = a.instance_id
    if os.environ.get("KPROXY_INTEROP_RDKAFKA_DEBUG"):
        # librdkafka's own debug contexts (e.g. "cgrp"), to its stderr.
        conf["debug"] = os.environ["KPROXY_INTEROP_RDKAFKA_DEBUG"]
    c = Consumer(conf)
    cooperative = a.assignor == "cooperative-sticky"
    owned = set()
    pending = []

    def flush():
        if not pending:
            return
        # consume() can return records of partitions a rebalance during
        # that call took away (confluent-kafka-python issue 1013); an
        # application drops them, or it commits a partition another
        # member owns now, under its own current generation, and that
        # partition's committed offset goes back.
        stale = [m for m in pending if m.partition() not in owned]
        if stale:
            emit(a.member, "dropped", partitions=sorted({m.partition() for m in stale}), count=len(stale))
            pending[:] = [m for m in pending if m.partition() in owned]
            if not pending:
                return
        offsets = {}
        for m in pending:
            offsets[m.partition()] = m.offset() + 1
        tps = [TopicPartition(a.topic, p, o) for p, o in offsets.items()]
        deadline = time.time() + 15  # below max.poll.interval.ms (20 s)
        while True:
            # An application keeps its batch while the coordinator moves
            # or restarts: retriable errors are retried for up to 15 s,
            # each try reported; others (a rebalance) give up at once.
            try:
                c.commit(offsets=tps, asynchronous=False)
                ok = True
                break
            except KafkaException as e:
                err = e.args[0]
                retry = err.retriable() or err.code() in COMMIT_RETRY_CODES
                if not retry or stopper.stop or time.time() > deadline:
                    emit(a.member, "error", error="commit: %s" % e)
                    ok = False
                    break
                emit(a.member, "error", error="commit (retrying): %s" % e)
                time.sleep(0.2)
        if ok:
            for m in pending:
                emit(a.member, "record", p=m.partition(), o=m.offset(), id=m.value().decode())
            emit(a.member, "commit", offsets={str(p): o for p, o in offsets.items()})
        del pending[:]

    def on_assign(_c, parts):
        if not cooperative:
            owned.clear()
        owned.update(tp.partition for tp in parts)
        # librdkafka does not expose the generation id.
        emit(a.member, "assigned", generation=-1, partitions=sorted(owned))

    def on_revoke(_c, parts):
        flush()
        if cooperative:
            owned.difference_update(tp.partition for tp in parts)
        else:
            owned.clear()
        emit(a.member, "revoked", generation=-1, partitions=sorted(owned))

    def on_lost(_c, parts):
        owned.difference_update(tp.partition for tp in parts)
        emit(a.member, "lost", generation=-1, partitions=sorted(owned))

    c.subscribe([a.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    emit(a.member, "ready")
    try:
        while not stopper.stop:
            msgs = c.consume(num_messages=200, timeout=0.2)
            for m in msgs:
                if m.error():
                    emit(a.member, "error", error=str(m.error()))
                else:
                    pending.append(m)
            flush()
    finally:
        flush()
        c.close()
        emit(a.member, "closed")


# ---------------------------------------------------------------- kafka-python

def share_ack_for(value, deliveries):
    """The explicit ack of a record (the Java Share program's rule): reject
    values ending in 7, release those ending in 3 on their first delivery,
    accept the rest."""
    from confluent_kafka import AcknowledgeType
    if value.endswith("7"):
        return AcknowledgeType.REJECT
    if value.endswith("3") and deliveries == 1:
        return AcknowledgeType.RELEASE
    return AcknowledgeType.ACCEPT


def share_out(lines):
    with _lock:
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()


def confluent_share(a, stopper):
    """A share-group member for the share rows (harness/shareserve.go):
    "STARTED", then per record "REC partition offset deliveryCount value"
    (with explicit acks, followed by the poll's wall-clock ms), "BATCH n"
    after each non-empty poll and "ERROR text" for errors. Implicit: each
    poll accepts the records of the one before. Explicit: each record gets
    share_ack_for's ack, commit_sync sends them before the next poll, and
    each record of a partition the broker answered without error is printed
    "ACK ms partition offset TYPE value" (ms: after commit_sync returned).
    After a non-empty poll it holds --hold-ms. It runs until SIGTERM."""
    from confluent_kafka import ShareConsumer, KafkaException
    conf = client_props(a)
    conf.update({"bootstrap.servers": a.bootstrap, "group.id": a.group, "client.id": a.member,
                 "share.acknowledgement.mode": a.ack,
                 # Errors librdkafka reports outside poll's messages (a
                 # broker without share groups: no ShareGroupHeartbeat).
                 "error_cb": lambda e: share_out(["ERROR %s" % e])})
    c = ShareConsumer(conf)
    c.subscribe([a.topic])
    share_out(["STARTED"])
    batches = 0
    try:
        while not stopper.stop:
            try:
                msgs = c.poll(1.0)
            except KafkaException as e:
                share_out(["ERROR poll: %s" % e])
                time.sleep(0.2)
                continue
            polled = int(time.time() * 1000)
            out, recs = [], []
            for m in msgs:
                if m.error() is not None:
                    out.append("ERROR %s" % m.error())
                    continue
                recs.append(m)
                line = "REC %d %d %d %s" % (m.partition(), m.offset(), m.delivery_count(), m.value().decode())
                out.append(line + (" %d" % polled if a.ack == "explicit" else ""))
            if recs:
                batches += 1
                out.append("BATCH %d" % batches)
            share_out(out)
            if a.ack == "explicit" and msgs:
                acks = []
                for m in msgs:
                    if m.error() is None:
                        t = share_ack_for(m.value().decode(), m.delivery_count())
                        c.acknowledge(m, t)
                        acks.append((m, t))
                out = []
                try:
                    res = c.commit_sync(15) or {}
                except KafkaException as e:
                    res, err = None, e
                now = int(time.time() * 1000)
                for m, t in acks:
                    if res is None:
                        out.append("ERROR ack p%d %d: commit_sync: %s" % (m.partition(), m.offset(), err))
                        continue
                    perr = "no result for the partition"
                    for tp, e in res.items():
                        if tp.topic == m.topic() and tp.partition == m.partition():
                            perr = e
                    if perr is not None:
                        out.append("ERROR ack p%d %d: %s" % (m.partition(), m.offset(), perr))
                    else:
                        out.append("ACK %d %d %d %s %s" % (now, m.partition(), m.offset(), t.name, m.value().decode()))
                share_out(out)
            if recs and a.hold_ms > 0:
                deadline = time.time() + a.hold_ms / 1000.0
                while not stopper.stop and time.time() < deadline:
                    time.sleep(0.05)
    finally:
        c.close()


def kp_produce(a):
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=a.bootstrap, client_id=a.member, acks="all", linger_ms=5)
    futures = []
    for i in range(a.start, a.start + a.count):
        rid = ("id-%d" % i).encode()
        futures.append(p.send(a.topic, key=rid, value=rid))
    p.flush(60)
    for f in futures:
        f.get(timeout=30)
    p.close()


def kp_consume(a, stopper):
    from kafka import KafkaConsumer, ConsumerRebalanceListener
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    strategies = [RangePartitionAssignor]
    if a.assignor == "cooperative-sticky":
        from kafka.coordinator.assignors import cooperative_sticky
        cls = [getattr(cooperative_sticky, n) for n in dir(cooperative_sticky)
               if n.endswith("Assignor") and "Cooperative" in n]
        if not cls:
            raise RuntimeError("this kafka-python has no cooperative sticky assignor")
        strategies = cls[:1]
    kwargs = dict(
        bootstrap_servers=a.bootstrap,
        group_id=a.group,
        client_id=a.member,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=a.session_ms,
        heartbeat_interval_ms=a.heartbeat_ms,
        max_poll_interval_ms=20000,
        max_poll_records=200,
        partition_assignment_strategy=strategies,
    )
    if a.instance_id:
        kwargs["group_instance_id"] = a.instance_id
    c = KafkaConsumer(**kwargs)
    owned = set()

    def generation():
        try:
            return int(c._coordinator._generation.generation_id)  # private, best effort
        except Exception:  # noqa: BLE001 - the attribute is not part of the API
            return -1

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            owned.difference_update(tp.partition for tp in revoked)
            emit(a.member, "revoked", generation=generation(), partitions=sorted(owned))

        def on_partitions_assigned(self, assigned):
            owned.update(tp.partition for tp in assigned)
            emit(a.member, "assigned", generation=generation(), partitions=sorted(owned))

        def on_partitions_lost(self, lost):
            owned.difference_update(tp.partition for tp in lost)
            emit(a.member, "lost", generation=generation(), partitions=sorted(owned))

    c.subscribe([a.topic], listener=Listener())
    emit(a.member, "ready")
    try:
        while not stopper.stop:
            batch = c.poll(timeout_ms=200, max_records=200)
            recs = [r for rs in batch.values() for r in rs]
            if not recs:
                continue
            try:
                c.commit()  # commits the positions after everything poll returned
            except Exception as e:  # noqa: BLE001 - reported, then redelivered to the new owner
                emit(a.member, "error", error="commit: %r" % e)
                continue
            offsets = {}
            for r in recs:
                emit(a.member, "record", p=r.partition, o=r.offset, id=r.value.decode())
                offsets[str(r.partition)] = r.offset + 1
            emit(a.member, "commit", offsets=offsets)
    finally:
        c.close()
        emit(a.member, "closed")


def main():
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # The harness sends SIGUSR1 to a stuck member to get its thread stacks.
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    a = parse_args()
    stopper = Stopper()
    try:
        if a.client == "confluent" and a.mode == "commit":
            confluent_commit(a)
        elif a.client == "confluent" and a.mode == "share":
            confluent_share(a, stopper)
        elif a.client == "confluent":
            confluent_produce(a) if a.mode == "produce" else confluent_consume(a, stopper)
        else:
            kp_produce(a) if a.mode == "produce" else kp_consume(a, stopper)
    except Exception as e:  # noqa: BLE001 - reported to the harness as an event
        emit(a.member, "error", error="%s: %s" % (type(e).__name__, e))
        return 1
    if a.mode == "produce":
        emit(a.member, "produced", count=a.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
