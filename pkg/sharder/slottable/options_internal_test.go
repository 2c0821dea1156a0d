package slottable

import (
	"strings"
	"testing"
	"time"

	"github.com/sharder-dev/sharder/pkg/membership"
	"github.com/sharder-dev/sharder/pkg/sharder/leasecontroller"
)

// TestOptions: NewController fills in the defaults and refuses invalid
// fields, naming them.
func TestOptions(t *testing.T) {
	c, err := New(Options{Registry: leasecontroller.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	o := c.opts
	if !strings.HasPrefix(o.Identity, "sharder:") || o.Clock == nil || o.Workers != DefaultWorkers ||
		o.WriteTimeout != membership.DefaultWriteTimeout {
		t.Errorf("defaults: %+v", o)
	}
	for field, opts := range map[string]Options{
		"Registry":     {},
		"Identity":     {Registry: leasecontroller.NewRegistry(), Identity: "me"},
		"WriteTimeout": {Registry: leasecontroller.NewRegistry(), WriteTimeout: -time.Second},
	} {
		if _, err := New(opts); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v, want one naming the field", field, err)
		}
	}
}
