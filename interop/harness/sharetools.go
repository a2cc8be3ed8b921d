package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// shareToolsVersion is the Kafka release whose kafka-share-groups
// (ShareGroupCommand) the share-serve rows run: the tool of a release
// that serves share groups (3.6.2 has none; 4.1's is the preview's),
// against kproxy whatever the broker behind it.
const shareToolsVersion = "4.4.0"

// shareServeTools runs Kafka's kafka-share-groups through addr once
// every record of group was acknowledged and its members left, and
// checks each command by its effect as a client of addr sees it:
//
//   - --list names the group;
//   - --describe shows every share-partition of topic starting at its
//     log's end, lag 0; --state shows it Empty; --members shows none;
//   - --reset-offsets --to-earliest --execute moves every start offset to
//     the log's start (DescribeShareGroupOffsets);
//   - --delete-offsets --topic leaves the group no offsets of topic;
//   - --delete removes the group: --list no longer names it and
//     DescribeShareGroups answers GROUP_ID_NOT_FOUND.
//
// The same checks hold directly against a broker that serves share
// groups (Kafka 4.2+).
func (s *scenario) shareServeTools(ctx context.Context, addr, group, topic, label string) error {
	t, err := s.newConsumerGroupsToolOf(ctx, shareToolsVersion)
	if err != nil {
		return err
	}
	t.mainClass = strings.Replace(t.mainClass, "ConsumerGroupCommand", "ShareGroupCommand", 1)
	t.bootstrap = addr
	run := func(args ...string) (string, error) {
		out, err := t.run(ctx, args...)
		if err == nil && strings.Contains(out, "Error:") {
			err = fmt.Errorf("kafka-share-groups %s: %s", strings.Join(args, " "), out)
		}
		return out, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := s.h.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	starts, err := s.h.adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("start offsets of %s: %w", topic, err)
	}

	// The members left (SIGTERM: their consumers closed); their leave
	// may still be on its way.
	var state string
	if _, err := s.waitFor(20*time.Second, "the share group to be Empty", func() bool {
		state, _ = run("--describe", "--group", group, "--state")
		return strings.Contains(state, " Empty ")
	}); err != nil {
		return fmt.Errorf("%w: --describe --state reads %s", err, state)
	}
	list, err := run("--list")
	if err != nil {
		return err
	}
	if !slices.Contains(strings.Fields(list), group) {
		return fmt.Errorf("kafka-share-groups --list %s lacks %s: %s", label, group, list)
	}
	described, err := run("--describe", "--group", group)
	if err != nil {
		return err
	}
	rows := shareDescribeRows(described, group, topic)
	for p := range int32(kindPartitions) {
		end, _ := ends.Lookup(topic, p)
		r, ok := rows[p]
		if !ok || r.start != end.Offset || (r.lag != "" && r.lag != "0") {
			return fmt.Errorf("kafka-share-groups --describe %s: partition %d reads %+v (found %v), want start %d (the log end), lag 0:\n%s", label, p, r, ok, end.Offset, described)
		}
	}
	members, err := run("--describe", "--group", group, "--members")
	if err != nil {
		return err
	}
	if !strings.Contains(members, "no active members") {
		return fmt.Errorf("kafka-share-groups --describe --members %s of an empty group reads:\n%s", label, members)
	}

	offsets := func() (map[int32]int64, error) {
		d, err := adm.DescribeShareGroupOffsets(ctx, group)
		if err != nil {
			return nil, err
		}
		if d[group].Err != nil {
			return nil, d[group].Err
		}
		out := map[int32]int64{}
		d[group].Offsets.Each(func(o kadm.ShareOffset) {
			if o.Topic == topic && o.StartOffset >= 0 {
				out[o.Partition] = o.StartOffset
			}
		})
		return out, nil
	}
	if _, err := run("--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute"); err != nil {
		return err
	}
	got, err := offsets()
	if err != nil {
		return fmt.Errorf("DescribeShareGroupOffsets after --reset-offsets: %w", err)
	}
	for p := range int32(kindPartitions) {
		start, _ := starts.Lookup(topic, p)
		if got[p] != start.Offset {
			return fmt.Errorf("after kafka-share-groups --reset-offsets --to-earliest %s, the share-partitions start at %v, want every one at its log start (p%d: %d)", label, got, p, start.Offset)
		}
	}
	if _, err := run("--delete-offsets", "--group", group, "--topic", topic); err != nil {
		return err
	}
	if got, err = offsets(); err != nil || len(got) > 0 {
		return fmt.Errorf("after kafka-share-groups --delete-offsets %s: offsets %v (%v), want none of %s", label, got, err, topic)
	}
	if _, err := run("--delete", "--group", group); err != nil {
		return err
	}
	if list, err = run("--list"); err != nil {
		return err
	}
	if slices.Contains(strings.Fields(list), group) {
		return fmt.Errorf("kafka-share-groups --list %s still names %s after --delete: %s", label, group, list)
	}
	d, err := adm.DescribeShareGroups(ctx, group)
	if err != nil {
		return fmt.Errorf("DescribeShareGroups after --delete: %w", err)
	}
	if d[group].Err == nil && d[group].GroupState != "Dead" {
		return fmt.Errorf("after kafka-share-groups --delete %s, DescribeShareGroups reads the group %s, want GROUP_ID_NOT_FOUND", label, d[group].GroupState)
	}
	s.note("%s: kafka-share-groups %s --list, --describe (start offsets at the log end, lag 0; --state Empty; --members none), --reset-offsets --to-earliest, --delete-offsets, --delete: each took effect", label, shareToolsVersion)
	return nil
}

// shareDescribeRow is one partition's line of kafka-share-groups
// --describe.
type shareDescribeRow struct {
	start int64
	lag   string // "" when the tool prints no lag column
}

// shareDescribeRows reads the lines "GROUP TOPIC PARTITION START-OFFSET
// [LAG]" of group and topic.
func shareDescribeRows(out, group, topic string) map[int32]shareDescribeRow {
	rows := map[int32]shareDescribeRow{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || f[0] != group || f[1] != topic {
			continue
		}
		p, err1 := strconv.Atoi(f[2])
		start, err2 := strconv.ParseInt(f[3], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		r := shareDescribeRow{start: start}
		if len(f) > 4 {
			r.lag = f[4]
		}
		rows[int32(p)] = r
	}
	return rows
}
