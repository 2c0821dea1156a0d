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
// sharder and by instances, is built here or by MetadataPatch.
func LabelPatch(resourceVersion string, labels map[string]*string) []byte {
	return MetadataPatch(resourceVersion, labels, nil)
}

// MetadataPatch is LabelPatch with annotations as well: each key of
// annotations is set to its value, or removed where the value is nil. No
// annotations: the patch leaves them alone.
func MetadataPatch(resourceVersion string, labels, annotations map[string]*string) []byte {
	var b strings.Builder
	b.Grow(64 + 48*(len(labels)+len(annotations)))
	b.WriteString(`{"metadata":{`)
	if resourceVersion != "" {
		b.WriteString(`"resourceVersion":`)
		writeString(&b, resourceVersion)
		b.WriteByte(',')
	}
	if len(annotations) > 0 {
		b.WriteString(`"annotations":`)
		writeMap(&b, annotations)
		b.WriteByte(',')
	}
	b.WriteString(`"labels":`)
	writeMap(&b, labels)
	b.WriteString("}}")
	return []byte(b.String())
}

// writeMap writes m as a JSON object with sorted keys, nil values as null.
func writeMap(b *strings.Builder, m map[string]*string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		writeString(b, k)
		b.WriteByte(':')
		if v := m[k]; v != nil {
			writeString(b, *v)
		} else {
			b.WriteString("null")
		}
	}
	b.WriteByte('}')
}

// writeString writes s as a JSON string.
func writeString(b *strings.Builder, s string) {
	data, err := json.Marshal(s)
	if err != nil { // a string always marshals
		panic(err)
	}
	b.Write(data)
}
