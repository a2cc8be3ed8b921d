package groupconfig

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/proxy"
)

// The messages are those a Kafka 4.4.0 broker with default broker
// configs answers IncrementalAlterConfigs with for the same values
// (measured against interop/kafka.sh --version 4.4.0; its bounds there
// were the harness's, here Kafka's defaults).
func TestValidateGroupConfigs(t *testing.T) {
	for _, tc := range []struct {
		set  map[string]string
		want string // "" valid
	}{
		{map[string]string{"share.auto.offset.reset": "earliest"}, ""},
		{map[string]string{"share.auto.offset.reset": "by_duration:PT1H"}, ""},
		{map[string]string{"share.auto.offset.reset": "by_duration:P1DT2H3M4.5S"}, ""},
		{map[string]string{"share.auto.offset.reset": " by_duration:PT0S "}, ""},
		// These three follow Java's Duration.parse (not measured).
		{map[string]string{"share.auto.offset.reset": "by_duration:P1Dt"}, ""},
		{map[string]string{"share.auto.offset.reset": "by_duration:PT"}, "Invalid value by_duration:PT for configuration share.auto.offset.reset: Invalid value `by_duration:PT` for configuration share.auto.offset.reset. The value must be either 'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'."},
		{map[string]string{"share.auto.offset.reset": "by_duration:P106751991167301D"}, "Invalid value by_duration:P106751991167301D for configuration share.auto.offset.reset: Invalid value `by_duration:P106751991167301D` for configuration share.auto.offset.reset. The value must be either 'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'."},
		{map[string]string{"share.auto.offset.reset": "middle"}, "Invalid value middle for configuration share.auto.offset.reset: Invalid value `middle` for configuration share.auto.offset.reset. The value must be either 'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'."},
		{map[string]string{"share.auto.offset.reset": "by_duration:-PT1H"}, "Invalid value by_duration:-PT1H for configuration share.auto.offset.reset: Invalid value `by_duration:-PT1H` for configuration share.auto.offset.reset. The value must be either 'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'."},
		{map[string]string{"share.auto.offset.reset": "EARLIEST"}, "Invalid value EARLIEST for configuration share.auto.offset.reset: Invalid value `EARLIEST` for configuration share.auto.offset.reset. The value must be either 'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'."},
		{map[string]string{"nope.x": "1"}, "Unknown group config name: nope.x"},
		{map[string]string{"share.record.lock.duration.ms": "abc"}, "Invalid value abc for configuration share.record.lock.duration.ms: Not a number of type INT"},
		{map[string]string{"share.record.lock.duration.ms": "10"}, "Invalid value 10 for configuration share.record.lock.duration.ms: Value must be at least 1000"},
		{map[string]string{"share.record.lock.duration.ms": "70000"}, "share.record.lock.duration.ms must be in the range 15000 to 60000 inclusive."},
		{map[string]string{"share.record.lock.duration.ms": " 20000 "}, ""},
		{map[string]string{"share.delivery.count.limit": "100"}, "share.delivery.count.limit must be in the range 2 to 10 inclusive."},
		{map[string]string{"share.delivery.count.limit": "1"}, "Invalid value 1 for configuration share.delivery.count.limit: Value must be at least 2"},
		{map[string]string{"share.delivery.count.limit": ""}, "Invalid value  for configuration share.delivery.count.limit: Not a number of type INT"},
		{map[string]string{"share.partition.max.record.locks": "100000"}, "share.partition.max.record.locks must be in the range 100 to 4000 inclusive."},
		{map[string]string{"share.isolation.level": "READ_COMMITTED"}, "Invalid value READ_COMMITTED for configuration share.isolation.level: String must be one of: read_committed, read_uncommitted"},
		{map[string]string{"share.isolation.level": "read_committed"}, ""},
		{map[string]string{"share.renew.acknowledge.enable": "maybe"}, "Invalid value maybe for configuration share.renew.acknowledge.enable: Expected value to be either true or false"},
		{map[string]string{"share.renew.acknowledge.enable": "TRUE"}, ""},
		{map[string]string{"share.session.timeout.ms": "50000", "share.heartbeat.interval.ms": "15000"}, ""},
		{map[string]string{"consumer.session.timeout.ms": "45000", "consumer.heartbeat.interval.ms": "5000"}, ""},
		{map[string]string{"consumer.heartbeat.interval.ms": "10"}, "consumer.heartbeat.interval.ms must be in the range 5000 to 15000 inclusive."},
	} {
		err := validateGroupConfigs(tc.set)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v, want valid", tc.set, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%v: %v, want %q", tc.set, err, tc.want)
		}
	}
}

func TestApplyOps(t *testing.T) {
	v := func(s string) *string { return &s }
	cur := map[string]string{"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "3"}
	for _, tc := range []struct {
		name    string
		ops     []alterOp
		replace bool
		code    int16
		msg     string
		next    map[string]string
	}{
		{"set", []alterOp{{"share.isolation.level", kmsg.IncrementalAlterConfigOpSet, v("read_committed")}}, false, 0, "",
			map[string]string{"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "3", "share.isolation.level": "read_committed"}},
		{"delete", []alterOp{{"share.delivery.count.limit", kmsg.IncrementalAlterConfigOpDelete, nil}}, false, 0, "",
			map[string]string{"share.auto.offset.reset": "earliest"}},
		{"delete unknown (Kafka 4.4 accepts it)", []alterOp{{"nope", kmsg.IncrementalAlterConfigOpDelete, nil}}, false, 0, "", cur},
		{"duplicate", []alterOp{{"share.isolation.level", kmsg.IncrementalAlterConfigOpSet, v("read_committed")}, {"share.isolation.level", kmsg.IncrementalAlterConfigOpDelete, nil}},
			false, kerr.InvalidRequest.Code, "Error due to duplicate config keys", nil},
		{"null set", []alterOp{{"share.auto.offset.reset", kmsg.IncrementalAlterConfigOpSet, nil}}, false, kerr.InvalidRequest.Code,
			"Null value not supported for : share.auto.offset.reset", nil},
		{"append to a non-list", []alterOp{{"share.auto.offset.reset", kmsg.IncrementalAlterConfigOpAppend, v("earliest")}}, false, kerr.InvalidConfig.Code,
			"Can't APPEND to key share.auto.offset.reset because its type is not LIST.", nil},
		{"subtract from a non-list", []alterOp{{"share.auto.offset.reset", kmsg.IncrementalAlterConfigOpSubtract, v("earliest")}}, false, kerr.InvalidConfig.Code,
			"Can't SUBTRACT to key share.auto.offset.reset because its type is not LIST.", nil},
		{"append to a list", []alterOp{{"streams.rack.aware.assignment.tags", kmsg.IncrementalAlterConfigOpAppend, v("zone,rack")}}, false, 0, "",
			map[string]string{"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "3", "streams.rack.aware.assignment.tags": "zone,rack"}},
		{"legacy alter replaces", []alterOp{{"share.isolation.level", kmsg.IncrementalAlterConfigOpSet, v("read_committed")}}, true, 0, "",
			map[string]string{"share.isolation.level": "read_committed"}},
		{"session not above heartbeat", []alterOp{{"share.session.timeout.ms", kmsg.IncrementalAlterConfigOpSet, v("45000")}, {"share.heartbeat.interval.ms", kmsg.IncrementalAlterConfigOpSet, v("45000")}},
			false, kerr.InvalidConfig.Code, "share.heartbeat.interval.ms must be in the range 5000 to 15000 inclusive.", nil},
	} {
		next, _, _, code, msg := applyOps(cur, tc.ops, tc.replace)
		if code != tc.code || msg != tc.msg {
			t.Errorf("%s: %d %q, want %d %q", tc.name, code, msg, tc.code, tc.msg)
			continue
		}
		if tc.next != nil && !equalMaps(next, tc.next) {
			t.Errorf("%s: next %v, want %v", tc.name, next, tc.next)
		}
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestDescribeGroup: the configs a Kafka 4.4 broker lists for a group
// (21 of them), set ones as GROUP_CONFIG with the broker config's
// default after them as synonyms, the others DEFAULT_CONFIG; names
// asked are answered in the order asked, unknown ones left out.
func TestDescribeGroup(t *testing.T) {
	set := map[string]string{"share.auto.offset.reset": "earliest"}
	all := describeGroup(set, nil, true, true)
	if len(all) != 21 {
		t.Errorf("%d configs listed, want 21 (as Kafka 4.4)", len(all))
	}
	by := map[string]kmsg.DescribeConfigsResponseResourceConfig{}
	for _, c := range all {
		by[c.Name] = c
		if c.ReadOnly || c.IsSensitive || c.Documentation == nil || *c.Documentation == "" {
			t.Errorf("%s: read-only %v, sensitive %v, documentation %v", c.Name, c.ReadOnly, c.IsSensitive, c.Documentation)
		}
	}
	aor := by["share.auto.offset.reset"]
	if *aor.Value != "earliest" || aor.Source != kmsg.ConfigSourceGroupConfig || len(aor.ConfigSynonyms) != 2 ||
		aor.ConfigSynonyms[1].Source != kmsg.ConfigSourceDefaultConfig || *aor.ConfigSynonyms[1].Value != "latest" {
		t.Errorf("share.auto.offset.reset: %+v", aor)
	}
	lock := by["share.record.lock.duration.ms"]
	if *lock.Value != "30000" || lock.Source != kmsg.ConfigSourceDefaultConfig || lock.ConfigType != kmsg.ConfigTypeInt ||
		len(lock.ConfigSynonyms) != 1 || lock.ConfigSynonyms[0].Name != "group.share.record.lock.duration.ms" {
		t.Errorf("share.record.lock.duration.ms: %+v", lock)
	}
	asked := describeGroup(set, []string{"share.isolation.level", "nope", "share.auto.offset.reset"}, false, false)
	if len(asked) != 2 || asked[0].Name != "share.isolation.level" || asked[1].Name != "share.auto.offset.reset" ||
		asked[0].ConfigSynonyms != nil || asked[0].Documentation != nil {
		t.Errorf("asked configs: %+v", asked)
	}
}

// TestStoreApplyOrder: a record older than the one a config holds (an
// alter applied on its answer, then an earlier record of another kproxy
// read from the topic) does not undo it.
func TestStoreApplyOrder(t *testing.T) {
	s := NewStore(nil, "", nil, nil)
	k := storeKey{Version: 1, Group: "g", Config: "share.auto.offset.reset"}
	v := func(s string) *string { return &s }
	s.apply(k, v("earliest"), 5)
	if s.apply(k, v("latest"), 3) {
		t.Error("an older record was applied")
	}
	if got := s.Group("g")["share.auto.offset.reset"]; got != "earliest" {
		t.Errorf("value %q, want earliest", got)
	}
	if !s.apply(k, nil, 6) || s.Group("g") != nil {
		t.Errorf("a later tombstone did not delete the config: %v", s.Group("g"))
	}
}

// TestServiceStore: alters answered by the service are in the topic
// before they are answered (a second store reading it sees them),
// validateOnly writes nothing, and the engine's settings follow.
func TestServiceStore(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	newConsumer := func(more ...kgo.Opt) (*kgo.Client, error) {
		return kgo.NewClient(append(append([]kgo.Opt(nil), opts...), more...)...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := NewStore(cl, "", newConsumer, nil)
	gc := NewConfigs(cl, time.Hour, nil)
	gc.UseStore(st)
	go st.Run(ctx)
	go gc.Run(ctx)
	svc := NewService(st, nil)
	call := func(req kmsg.Request) kmsg.Response {
		ch := make(chan kmsg.Response, 1)
		svc.Handle(proxy.Client{}, req, func(r kmsg.Response) { ch <- r })
		return <-ch
	}
	alter := func(validateOnly bool, name, value string) int16 {
		req := kmsg.NewPtrIncrementalAlterConfigsRequest()
		req.ValidateOnly = validateOnly
		r := kmsg.NewIncrementalAlterConfigsRequestResource()
		r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeGroupConfig, "g"
		cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		cfg.Name, cfg.Value = name, &value
		r.Configs = append(r.Configs, cfg)
		req.Resources = append(req.Resources, r)
		return call(req).(*kmsg.IncrementalAlterConfigsResponse).Resources[0].ErrorCode
	}
	gc.Get("g") // the engine asks about g
	if code := alter(true, "share.auto.offset.reset", "earliest"); code != 0 {
		t.Fatalf("validateOnly: %v", kerr.ErrorForCode(code))
	}
	if st.Group("g") != nil {
		t.Fatalf("validateOnly wrote %v", st.Group("g"))
	}
	if code := alter(false, "share.auto.offset.reset", "earliest"); code != 0 {
		t.Fatalf("alter: %v", kerr.ErrorForCode(code))
	}
	if code := alter(false, "share.record.lock.duration.ms", "5"); code != kerr.InvalidConfig.Code {
		t.Fatalf("a bad value: %v, want INVALID_CONFIG", kerr.ErrorForCode(code))
	}
	// Another kproxy's store, reading the topic from the start.
	other := NewStore(cl, "", newConsumer, nil)
	go other.Run(ctx)
	select {
	case <-other.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the second store did not read the topic")
	}
	if got := other.Group("g"); got["share.auto.offset.reset"] != "earliest" || len(got) != 1 {
		t.Fatalf("the second store holds %v", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for gc.Get("g").Share.AutoOffsetReset != "earliest" {
		if time.Now().After(deadline) {
			t.Fatalf("the engine's settings of g: %+v, want share auto offset reset earliest", gc.Get("g"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	desc := kmsg.NewPtrDescribeConfigsRequest()
	r := kmsg.NewDescribeConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeGroupConfig, ""
	desc.Resources = append(desc.Resources, r)
	res := call(desc).(*kmsg.DescribeConfigsResponse).Resources[0]
	if res.ErrorCode != kerr.InvalidRequest.Code || res.ErrorMessage == nil || *res.ErrorMessage != "Group name must not be empty" {
		t.Errorf("an empty group name: %d %v", res.ErrorCode, res.ErrorMessage)
	}
}
