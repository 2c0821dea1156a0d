package ring

// ObjectKey returns the hash key of a main object:
// "<group>/<Kind>/<namespace>/<name>", with an empty group for the core API
// group and an empty namespace for cluster-scoped objects.
func ObjectKey(group, kind, namespace, name string) string {
	return group + "/" + kind + "/" + namespace + "/" + name
}
