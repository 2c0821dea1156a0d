package assign_test

import (
	"strings"
	"testing"

	"k8s.io/client-go/tools/record"

	"github.com/sharder-dev/sharder/pkg/sharder/assign"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

func TestNewRequiresRegistryAndRecorder(t *testing.T) {
	for name, c := range map[string]struct {
		opts assign.Options
		want string
	}{
		"no registry": {assign.Options{EventRecorder: &record.FakeRecorder{}}, "Registry"},
		"no recorder": {assign.Options{Registry: leasecontroller.NewRegistry()}, "EventRecorder"},
	} {
		if _, err := assign.New(c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %s", name, err, c.want)
		}
	}
	if _, err := assign.New(assign.Options{Registry: leasecontroller.NewRegistry(), EventRecorder: &record.FakeRecorder{}}); err != nil {
		t.Errorf("complete options: %v", err)
	}
}
