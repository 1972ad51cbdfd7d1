package objectstore

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// The object store's wire names (ADR-20), as nats.go's jetstream/object.go
// and the nats CLI spell them. Nothing else in this package builds a subject.
const (
	streamNameTmpl = "OBJ_%s"          // the bucket's stream
	chunksAllTmpl  = "$O.%s.C.>"       // every chunk subject of a bucket
	chunkSubjTmpl  = "$O.%s.C.%s"      // $O.<bucket>.C.<nuid>: one object's chunks
	metaSubjTmpl   = "$O.%s.M.%s"      // $O.<bucket>.M.<base64url(name)>: its meta
	directGetTmpl  = "%sDIRECT.GET.%s" // <api prefix>DIRECT.GET.<stream>
	digestPrefix   = "SHA-256="
	defaultAPI     = "$JS.API."
	domainAPITmpl  = "$JS.%s.API."
)

// Headers read and written.
const (
	hdrRollup     = "Nats-Rollup" // "sub" on every meta message
	rollupSubject = "sub"
	hdrSequence   = "Nats-Sequence"
	hdrNumPending = "Nats-Num-Pending"
	hdrLastSeq    = "Nats-Last-Sequence"
	hdrTimeStamp  = "Nats-Time-Stamp"
	hdrStatus     = "Status"
	hdrDesc       = "Description"

	// A parted object's manifest carries these in its meta headers so that
	// Stat and Wait need no second read.
	hdrParts  = "Jetfabric-Parts"
	hdrSize   = "Jetfabric-Size"
	hdrSHA256 = "Jetfabric-Sha256"
)

// Statuses in direct-get and publish replies.
const (
	statusEOB          = "204"
	statusNotFound     = "404"
	statusNoResponders = "503"
)

// Server error codes (nats-server errors.json) after which a writer retries.
const (
	codeTooManyRequests = 429   // per-stream ingest queue full
	errClusterNotAvail  = 10008 // JetStream temporarily unavailable
)

func metaSubject(bucket, name string) string {
	return fmt.Sprintf(metaSubjTmpl, bucket, base64.URLEncoding.EncodeToString([]byte(name)))
}

func chunkSubject(bucket, nuid string) string {
	return fmt.Sprintf(chunkSubjTmpl, bucket, nuid)
}

// apiPrefix is the JetStream API prefix the jetstream.JetStream uses.
func apiPrefix(domain, prefix string) string {
	switch {
	case domain != "":
		return fmt.Sprintf(domainAPITmpl, domain)
	case prefix == "":
		return defaultAPI
	case strings.HasSuffix(prefix, "."):
		return prefix
	default:
		return prefix + "."
	}
}

// pubAck is a JetStream publish acknowledgement or refusal.
type pubAck struct {
	Stream string    `json:"stream"`
	Seq    uint64    `json:"seq"`
	Error  *apiError `json:"error,omitempty"`
}

type apiError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%s (code %d, err_code %d)", e.Description, e.Code, e.ErrCode)
}

// digestString is the ADR-20 form of a SHA-256: "SHA-256=" + base64url.
func digestString(sum [sha256.Size]byte) string {
	return digestPrefix + base64.URLEncoding.EncodeToString(sum[:])
}

// parseDigest decodes an ADR-20 digest. Writers pad their base64url
// (nats.go does); an unpadded one is accepted too.
func parseDigest(s string) ([]byte, error) {
	rest, ok := strings.CutPrefix(s, digestPrefix)
	if !ok {
		return nil, fmt.Errorf("digest %q is not %s<base64url>", s, digestPrefix)
	}
	b, err := base64.URLEncoding.DecodeString(rest)
	if err != nil {
		b, err = base64.RawURLEncoding.DecodeString(rest)
	}
	if err != nil || len(b) != sha256.Size {
		return nil, fmt.Errorf("digest %q is not a base64url SHA-256", s)
	}
	return b, nil
}

// hexDigest turns an ADR-20 digest into hex, or "" when it is malformed.
func hexDigest(s string) string {
	b, err := parseDigest(s)
	if err != nil {
		return ""
	}
	return hex.EncodeToString(b)
}

// status returns a reply's status code ("" for a data message).
func status(m *nats.Msg) string {
	if len(m.Data) != 0 || m.Header == nil {
		return ""
	}
	return m.Header.Get(hdrStatus)
}

func headerUint(m *nats.Msg, key string) (uint64, error) {
	v := m.Header.Get(key)
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("header %s %q: %v", key, v, err)
	}
	return n, nil
}

// manifest is the content of a parted object (see WithParts).
type manifest struct {
	Version int        `json:"version"`
	Size    int64      `json:"size"`
	SHA256  string     `json:"sha256"` // hex, of the whole data
	Parts   []partInfo `json:"parts"`
}

type partInfo struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	Digest string `json:"digest"` // ADR-20 form, as in the part's meta
}

const manifestVersion = 1
