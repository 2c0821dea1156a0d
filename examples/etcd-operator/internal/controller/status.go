package controller

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What the three controllers (clusters, backups, restores) share to report
// what they observed.

// writeStatus writes obj's status with a merge patch from original's,
// locked on original's resource version, unless unchanged says there is
// nothing to write. An object deleted meanwhile has no status to write.
func writeStatus(ctx context.Context, c client.Client, original, obj client.Object, unchanged bool) error {
	if unchanged {
		return nil
	}
	patch := client.MergeFromWithOptions(original, client.MergeFromWithOptimisticLock{})
	if err := c.Status().Patch(ctx, obj, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patching status: %w", err)
	}
	return nil
}

// setStatusCondition sets a condition of an object of generation gen in
// conditions; its transition time is now if its status changes.
func setStatusCondition(conditions *[]metav1.Condition, gen int64, now time.Time, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(conditions, metav1.Condition{
		Type:               typ,
		Status:             status,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: gen,
		LastTransitionTime: metav1.NewTime(now),
	})
}

// recordEvent records an event about obj, if there is a recorder.
func recordEvent(recorder events.EventRecorder, obj runtime.Object, eventType, reason, action, note string, args ...any) {
	if recorder == nil {
		return
	}
	recorder.Eventf(obj, nil, eventType, reason, action, note, args...)
}
