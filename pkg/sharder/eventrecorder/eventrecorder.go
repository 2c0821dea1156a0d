// Package eventrecorder records the sharder's events as core/v1 Events.
//
// The events.k8s.io/v1 recorder (client-go tools/events, behind
// controller-runtime's GetEventRecorder) folds events of the same type,
// reason, action, regarding and related object into one series that keeps
// the first note and writes the later ones only at a periodic refresh: a
// second "MembershipChanged" on a ring would show the first one's text.
// The core/v1 recorder (client-go tools/record) tells events apart by their
// message too, so every distinct text is written at once; it still counts
// an identical repeat on the existing Event, aggregates an object's events
// of one reason after 10 different messages in 10 minutes, and limits each
// object to a burst of 25 events, then one per 5 minutes.
package eventrecorder

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// New returns a recorder that writes core/v1 Events as component through
// its own broadcaster, which starts now and stops with mgr.
func New(mgr manager.Manager, component string) (record.EventRecorder, error) {
	cs, err := kubernetes.NewForConfigAndClient(mgr.GetConfig(), mgr.GetHTTPClient())
	if err != nil {
		return nil, fmt.Errorf("creating the event client: %w", err)
	}
	b := record.NewBroadcaster()
	if err := mgr.Add(stopper{b}); err != nil {
		return nil, fmt.Errorf("adding the event broadcaster: %w", err)
	}
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	return b.NewRecorder(mgr.GetScheme(), corev1.EventSource{Component: component}), nil
}

// stopper shuts the broadcaster down when the manager stops, on every
// replica (events may be recorded before the election is won).
type stopper struct{ b record.EventBroadcaster }

func (s stopper) Start(ctx context.Context) error {
	<-ctx.Done()
	s.b.Shutdown()
	return nil
}

func (stopper) NeedLeaderElection() bool { return false }
