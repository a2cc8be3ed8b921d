package groupconfig

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// The GROUP configs Kafka 4.4 knows (its GroupConfig), as kproxy
// validates and describes them where it keeps them itself (a cluster
// without GROUP configs, Kafka before 4.0). Names, types, defaults, the
// broker configs they default to (their synonyms), the per-value checks
// and the broker bounds are those a Kafka 4.4 broker with its default
// broker configs shows and applies (read from its DescribeConfigs and
// IncrementalAlterConfigs answers); the error messages are the ones it
// answers with, since clients show them to their users.

// groupConfigDef is one GROUP config.
type groupConfigDef struct {
	name    string
	typ     kmsg.ConfigType
	def     string // Kafka's default (the broker config's default)
	synonym string // the broker config it defaults to
	// listed: shown by a DescribeConfigs that names no configs (Kafka
	// 4.4 leaves a few internal ones out).
	listed bool
	// atLeast is the value check of an INT or LONG config (hasAtLeast).
	atLeast    int64
	hasAtLeast bool
	// lo, hi: the broker bounds a value must be within (hasRange), or
	// only below hi (hasMax).
	lo, hi           int64
	hasRange, hasMax bool
	// oneOf: the values a STRING config may take (exactly).
	oneOf []string
	doc   string // kproxy's own one-line description
}

// intDef is an INT config of at least atLeast within the broker bounds
// [lo, hi] (lo > hi: no bounds).
func intDef(name, synonym, def string, atLeast, lo, hi int64, doc string) groupConfigDef {
	return groupConfigDef{name: name, typ: kmsg.ConfigTypeInt, def: def, synonym: synonym, listed: true,
		atLeast: atLeast, hasAtLeast: true, lo: lo, hi: hi, hasRange: lo <= hi, doc: doc}
}

// groupConfigDefs lists the GROUP configs in the order kproxy describes
// them.
var groupConfigDefs = []groupConfigDef{
	intDef("consumer.session.timeout.ms", "group.consumer.session.timeout.ms", "45000", 1, 45000, 60000,
		"Session timeout of a consumer group's members (KIP-848)."),
	intDef("consumer.heartbeat.interval.ms", "group.consumer.heartbeat.interval.ms", "5000", 1, 5000, 15000,
		"Heartbeat interval given to a consumer group's members (KIP-848)."),
	intDef("consumer.assignment.interval.ms", "group.consumer.assignment.interval.ms", "1000", 0, 0, 15000,
		"Least time between two assignments of a consumer group."),
	{name: "consumer.assignor.offload.enable", typ: kmsg.ConfigTypeBoolean, def: "false", synonym: "consumer.assignor.offload.enable",
		doc: "Whether a consumer group's assignment runs off the coordinator's thread."},
	intDef("share.session.timeout.ms", "group.share.session.timeout.ms", "45000", 1, 45000, 60000,
		"Session timeout of a share group's members (KIP-932)."),
	intDef("share.heartbeat.interval.ms", "group.share.heartbeat.interval.ms", "5000", 1, 5000, 15000,
		"Heartbeat interval given to a share group's members (KIP-932)."),
	intDef("share.record.lock.duration.ms", "group.share.record.lock.duration.ms", "30000", 1000, 15000, 60000,
		"How long a share consumer holds the records it acquired before they are released."),
	intDef("share.delivery.count.limit", "group.share.delivery.count.limit", "5", 2, 2, 10,
		"Deliveries of a record to a share group before it is archived."),
	intDef("share.partition.max.record.locks", "group.share.partition.max.record.locks", "2000", 100, 100, 4000,
		"Records in flight (acquired) per share-partition."),
	intDef("share.assignment.interval.ms", "group.share.assignment.interval.ms", "1000", 0, 0, 15000,
		"Least time between two assignments of a share group."),
	{name: "share.assignor.offload.enable", typ: kmsg.ConfigTypeBoolean, def: "false", synonym: "share.assignor.offload.enable",
		doc: "Whether a share group's assignment runs off the coordinator's thread."},
	{name: "share.auto.offset.reset", typ: kmsg.ConfigTypeString, def: "latest", synonym: "share.auto.offset.reset", listed: true,
		doc: "Where a share group starts on a partition it has no state for: earliest, latest or by_duration:<ISO-8601 duration>."},
	{name: "share.isolation.level", typ: kmsg.ConfigTypeString, def: "read_uncommitted", synonym: "share.isolation.level", listed: true,
		oneOf: []string{"read_committed", "read_uncommitted"},
		doc:   "Whether a share group is delivered the records of aborted transactions."},
	{name: "share.renew.acknowledge.enable", typ: kmsg.ConfigTypeBoolean, def: "true", synonym: "share.renew.acknowledge.enable", listed: true,
		doc: "Whether a share group's consumers may renew their acquisition locks."},
	{name: "errors.deadletterqueue.topic.name", typ: kmsg.ConfigTypeString, def: "", synonym: "errors.deadletterqueue.topic.name", listed: true,
		doc: "A share group's dead-letter topic (empty: none)."},
	{name: "errors.deadletterqueue.copy.record.enable", typ: kmsg.ConfigTypeBoolean, def: "false", synonym: "errors.deadletterqueue.copy.record.enable", listed: true,
		doc: "Whether a dead-lettered record is copied whole or only described."},
	intDef("streams.session.timeout.ms", "group.streams.session.timeout.ms", "45000", 1, 45000, 60000,
		"Session timeout of a streams group's members (KIP-1071)."),
	intDef("streams.heartbeat.interval.ms", "group.streams.heartbeat.interval.ms", "5000", 1, 5000, 15000,
		"Heartbeat interval given to a streams group's members (KIP-1071)."),
	intDef("streams.initial.rebalance.delay.ms", "group.streams.initial.rebalance.delay.ms", "3000", 0, 1, 0,
		"How long a new streams group waits for members before its first assignment."),
	intDef("streams.assignment.interval.ms", "group.streams.assignment.interval.ms", "1000", 0, 0, 15000,
		"Least time between two assignments of a streams group."),
	{name: "streams.num.standby.replicas", typ: kmsg.ConfigTypeInt, def: "0", synonym: "group.streams.num.standby.replicas", listed: true,
		atLeast: 0, hasAtLeast: true, hi: 2, hasMax: true,
		doc: "Standby replicas of each task of a streams group."},
	{name: "streams.rack.aware.assignment.tags", typ: kmsg.ConfigTypeList, def: "", synonym: "group.streams.rack.aware.assignment.tags", listed: true,
		doc: "Client tag keys a streams group's assignment spreads standby replicas over."},
	{name: "streams.assignor.name", typ: kmsg.ConfigTypeString, def: "sticky", synonym: "group.streams.assignors", listed: true,
		oneOf: []string{"sticky"},
		doc:   "The task assignor of a streams group."},
	{name: "streams.task.offset.interval.ms", typ: kmsg.ConfigTypeInt, def: "60000", synonym: "group.streams.task.offset.interval.ms",
		atLeast: 1, hasAtLeast: true, doc: "How often a streams group's members report their task offsets."},
	{name: "streams.num.warmup.replicas", typ: kmsg.ConfigTypeInt, def: "2", synonym: "group.streams.num.warmup.replicas",
		atLeast: 0, hasAtLeast: true, doc: "Warm-up replicas of a streams group's tasks."},
	{name: "streams.acceptable.recovery.lag", typ: kmsg.ConfigTypeLong, def: "10000", synonym: "group.streams.acceptable.recovery.lag",
		atLeast: 0, hasAtLeast: true, doc: "Lag under which a streams group's task counts as caught up."},
}

// defByName indexes groupConfigDefs.
var defByName = func() map[string]*groupConfigDef {
	m := make(map[string]*groupConfigDef, len(groupConfigDefs))
	for i := range groupConfigDefs {
		m[groupConfigDefs[i].name] = &groupConfigDefs[i]
	}
	return m
}()

// configError is an INVALID_CONFIG answer with Kafka's message.
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

func invalidValue(d *groupConfigDef, v, why string) error {
	return &configError{fmt.Sprintf("Invalid value %s for configuration %s: %s", v, d.name, why)}
}

// parseValue checks one value as Kafka's ConfigDef parses it, returning
// the number of an INT or LONG config.
func (d *groupConfigDef) parseValue(v string) (int64, error) {
	t := strings.TrimSpace(v)
	switch d.typ {
	case kmsg.ConfigTypeInt, kmsg.ConfigTypeLong:
		bits, what := 32, "INT"
		if d.typ == kmsg.ConfigTypeLong {
			bits, what = 64, "LONG"
		}
		n, err := strconv.ParseInt(t, 10, bits)
		if err != nil {
			return 0, invalidValue(d, v, "Not a number of type "+what)
		}
		if d.hasAtLeast && n < d.atLeast {
			return 0, invalidValue(d, v, fmt.Sprintf("Value must be at least %d", d.atLeast))
		}
		return n, nil
	case kmsg.ConfigTypeBoolean:
		if !strings.EqualFold(t, "true") && !strings.EqualFold(t, "false") {
			return 0, invalidValue(d, v, "Expected value to be either true or false")
		}
	case kmsg.ConfigTypeString:
		if d.name == "share.auto.offset.reset" && t != "earliest" && t != "latest" {
			// by_duration takes no negative duration, and kproxy no
			// sign at all (groupstate.ShareResetDuration).
			if _, isDur, err := groupstate.ShareResetDuration(t); !isDur || err != nil {
				return 0, invalidValue(d, v, fmt.Sprintf("Invalid value `%s` for configuration %s. The value must be either 'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'.", v, d.name))
			}
		}
		if len(d.oneOf) > 0 && !slices.Contains(d.oneOf, t) {
			return 0, invalidValue(d, v, "String must be one of: "+strings.Join(d.oneOf, ", "))
		}
	}
	return 0, nil
}

// validateGroupConfigs checks a group's whole set of configs (what it
// would hold after an alter) as Kafka's GroupConfig does: every name
// known, every value parsed, ints within the broker bounds, and each
// session timeout above its heartbeat interval (set or default).
func validateGroupConfigs(set map[string]string) error {
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if defByName[n] == nil {
			return &configError{"Unknown group config name: " + n}
		}
	}
	nums := map[string]int64{}
	for _, d := range groupConfigDefs {
		v, ok := set[d.name]
		if !ok {
			if d.typ == kmsg.ConfigTypeInt {
				n, _ := strconv.ParseInt(d.def, 10, 32)
				nums[d.name] = n
			}
			continue
		}
		n, err := d.parseValue(v)
		if err != nil {
			return err
		}
		nums[d.name] = n
	}
	for _, d := range groupConfigDefs {
		if _, ok := set[d.name]; !ok {
			continue
		}
		n := nums[d.name]
		switch {
		case d.hasRange && (n < d.lo || n > d.hi):
			return &configError{fmt.Sprintf("%s must be in the range %d to %d inclusive.", d.name, d.lo, d.hi)}
		case d.hasMax && n > d.hi:
			return &configError{fmt.Sprintf("%s must be less than or equal to %d.", d.name, d.hi)}
		}
	}
	for _, kind := range []string{"consumer", "share", "streams"} {
		session, interval := kind+".session.timeout.ms", kind+".heartbeat.interval.ms"
		_, s := set[session]
		_, i := set[interval]
		if (s || i) && nums[session] <= nums[interval] {
			return &configError{fmt.Sprintf("%s must be greater than %s", session, interval)}
		}
	}
	return nil
}
