package proxy

import "github.com/twmb/franz-go/pkg/kversion"

// maxProduce returns the client's versions with Produce capped at v.
func maxProduce(v int16) *kversion.Versions {
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(0, v)
	return vs
}
