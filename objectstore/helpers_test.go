package objectstore_test

import (
	"encoding/base64"
	"encoding/json"
	"testing"
)

func encodeName(name string) string { return base64.URLEncoding.EncodeToString([]byte(name)) }

func b64(b []byte) string { return base64.URLEncoding.EncodeToString(b) }

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
