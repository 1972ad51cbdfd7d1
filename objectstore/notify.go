package objectstore

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
)

// Notify calls stored, on a goroutine of the connection's, with the name
// and size of every object whose name starts with prefix as its meta is
// stored from now on (a complete object, not a deletion), until stop is
// called. Nothing stored before Notify is reported, and a notification
// lost with the connection is not made up for: it is a hint to read an
// object early, never the record of what the bucket holds.
func (s *Store) Notify(prefix string, stored func(name string, size int64)) (stop func(), err error) {
	head := fmt.Sprintf(metaSubjTmpl, s.bucket, "")
	sub, err := s.nc.Subscribe(head+">", func(m *nats.Msg) {
		raw, err := base64.URLEncoding.DecodeString(strings.TrimPrefix(m.Subject, head))
		if err != nil || !strings.HasPrefix(string(raw), prefix) {
			return
		}
		var meta struct {
			Size    int64 `json:"size"`
			Deleted bool  `json:"deleted"`
		}
		if json.Unmarshal(m.Data, &meta) != nil || meta.Deleted {
			return
		}
		stored(string(raw), meta.Size)
	})
	if err != nil {
		return nil, fmt.Errorf("objectstore: %s: notify: %w", s.bucket, err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}
