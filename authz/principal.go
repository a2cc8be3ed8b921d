package authz

import (
	"bytes"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
)

// Anonymous is the principal Kafka gives a connection that neither
// authenticated with SASL nor presented a client certificate.
const Anonymous = "User:ANONYMOUS"

// OAuthBearerSubject returns the subject of the token in a client's
// OAUTHBEARER initial response (RFC 7628: gs2-header, then
// "\x01auth=Bearer <token>\x01...\x01"): the JWT's "sub" claim, which is
// the principal name Kafka's OAUTHBEARER validators give by default
// (sasl.oauthbearer.sub.claim.name). The token's signature is not
// checked here: the broker checks it, and the name counts only once the
// broker has accepted the exchange.
func OAuthBearerSubject(auth []byte) (string, bool) {
	for _, kv := range bytes.Split(auth, []byte{1}) {
		v, ok := bytes.CutPrefix(kv, []byte("auth="))
		if !ok {
			continue
		}
		scheme, token, ok := bytes.Cut(v, []byte(" "))
		if !ok || !strings.EqualFold(string(scheme), "bearer") {
			return "", false
		}
		parts := bytes.Split(bytes.TrimSpace(token), []byte("."))
		if len(parts) != 3 {
			return "", false
		}
		payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(string(parts[1]), "="))
		if err != nil {
			return "", false
		}
		var claims struct {
			Sub *string `json:"sub"`
		}
		if err := json.Unmarshal(payload, &claims); err != nil || claims.Sub == nil || *claims.Sub == "" {
			return "", false
		}
		return *claims.Sub, true
	}
	return "", false
}

// CertPrincipal returns the principal Kafka gives a client on an mTLS
// listener with the default ssl.principal.mapping.rules: "User:" and the
// certificate's subject as Java's X500Principal.getName() prints it
// (RFC 2253: the most specific RDN first, the keywords CN, C, L, ST, O,
// OU, STREET, DC and UID, any other attribute as its OID and "#" with the
// hex of its DER value, special characters escaped).
func CertPrincipal(cert *x509.Certificate) string {
	return "User:" + RFC2253(cert.RawSubject)
}

// rfc2253Keywords are the attribute keywords X500Principal's RFC 2253
// form uses; every other type prints as its dotted OID.
var rfc2253Keywords = map[string]string{
	"2.5.4.3":                    "CN",
	"2.5.4.6":                    "C",
	"2.5.4.7":                    "L",
	"2.5.4.8":                    "ST",
	"2.5.4.10":                   "O",
	"2.5.4.11":                   "OU",
	"2.5.4.9":                    "STREET",
	"0.9.2342.19200300.100.1.25": "DC",
	"0.9.2342.19200300.100.1.1":  "UID",
}

// RFC2253 formats a DER-encoded X.501 Name as X500Principal.getName()
// does. A name that does not parse formats as "".
func RFC2253(rawSubject []byte) string {
	var seq pkix.RDNSequence
	if rest, err := asn1.Unmarshal(rawSubject, &seq); err != nil || len(rest) > 0 {
		return ""
	}
	// An attribute without a keyword prints as the hex of its DER
	// value, which the decoded sequence no longer has.
	rdns := rawRDNs(rawSubject)
	var b strings.Builder
	for i := len(seq) - 1; i >= 0; i-- {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		for j, atv := range seq[i] {
			if j > 0 {
				b.WriteByte('+')
			}
			oid := atv.Type.String()
			kw, known := rfc2253Keywords[oid]
			s, isString := atv.Value.(string)
			if known && isString {
				b.WriteString(kw)
				b.WriteByte('=')
				b.WriteString(escape2253(s))
				continue
			}
			if known {
				b.WriteString(kw)
			} else {
				b.WriteString(oid)
			}
			b.WriteString("=#")
			if i < len(rdns) && j < len(rdns[i]) {
				b.WriteString(hex.EncodeToString(rdns[i][j]))
			}
		}
	}
	return b.String()
}

// rawRDNs returns, per RDN and attribute, the DER of each attribute
// value.
func rawRDNs(rawSubject []byte) [][][]byte {
	var seq []asn1.RawValue
	if _, err := asn1.Unmarshal(rawSubject, &seq); err != nil {
		return nil
	}
	out := make([][][]byte, len(seq))
	for i, set := range seq {
		rest := set.Bytes
		for len(rest) > 0 {
			var atv asn1.RawValue
			var err error
			if rest, err = asn1.Unmarshal(rest, &atv); err != nil {
				break
			}
			var parts struct {
				Type  asn1.ObjectIdentifier
				Value asn1.RawValue
			}
			if _, err := asn1.Unmarshal(atv.FullBytes, &parts); err != nil {
				break
			}
			out[i] = append(out[i], parts.Value.FullBytes)
		}
	}
	return out
}

// escape2253 escapes a value as RFC 2253 section 2.4 requires: one of
// ,+"\<>; anywhere, '#' or a space at the start, a space at the end.
func escape2253(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case strings.ContainsRune(",+\"\\<>;", r),
			i == 0 && (r == '#' || r == ' '),
			i == len(s)-1 && r == ' ':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
