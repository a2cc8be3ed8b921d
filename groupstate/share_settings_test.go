package groupstate

import (
	"testing"
	"time"
)

// A share group's settings: its own GROUP configs, then the cluster's
// group.share.* broker settings, then Kafka's defaults.
func TestShareSettingsPrecedence(t *testing.T) {
	e := &Engine{cfg: Config{
		ShareDefaults: ShareSettings{SessionTimeout: 10 * time.Second, DeliveryLimit: 3},
		GroupSettings: func(group string) GroupSettings {
			if group == "own" {
				return GroupSettings{Share: ShareSettings{SessionTimeout: 20 * time.Second, LockDuration: time.Second}}
			}
			return GroupSettings{}
		},
	}}
	own, other := e.shareSettings("own"), e.shareSettings("other")
	if own.SessionTimeout != 20*time.Second || own.LockDuration != time.Second || own.DeliveryLimit != 3 || own.HeartbeatInterval != 5*time.Second {
		t.Errorf("a group with its own configs: %+v", own)
	}
	if other.SessionTimeout != 10*time.Second || other.LockDuration != 30*time.Second || other.DeliveryLimit != 3 || other.MaxSize != 200 {
		t.Errorf("a group without: %+v", other)
	}
}
