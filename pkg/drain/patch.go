package drain

import (
	"encoding/json"
	"slices"
	"strings"
)

// LabelPatch returns a JSON merge patch of an object's labels: each key of
// labels is set to its value, or removed where the value is nil. With a
// non-empty resourceVersion the patch carries it, so the API server applies
// it only to that version of the object and answers Conflict otherwise
// (optimistic locking). Every write of the shard and drain labels, by the
// sharder and by instances, is built here.
func LabelPatch(resourceVersion string, labels map[string]*string) []byte {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.Grow(64 + 48*len(keys))
	b.WriteString(`{"metadata":{`)
	if resourceVersion != "" {
		b.WriteString(`"resourceVersion":`)
		writeString(&b, resourceVersion)
		b.WriteByte(',')
	}
	b.WriteString(`"labels":{`)
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		writeString(&b, k)
		b.WriteByte(':')
		if v := labels[k]; v != nil {
			writeString(&b, *v)
		} else {
			b.WriteString("null")
		}
	}
	b.WriteString("}}}")
	return []byte(b.String())
}

// writeString writes s as a JSON string.
func writeString(b *strings.Builder, s string) {
	data, err := json.Marshal(s)
	if err != nil { // a string always marshals
		panic(err)
	}
	b.Write(data)
}
