package app

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
)

func writeStatus(out io.Writer, format outputFormat, report *StatusReport) error {
	if format.structured() {
		return writeStructured(out, format, report)
	}
	return writeStatusTable(out, report)
}

// writeStatusTable prints each ring as a few header lines and a table of its
// instances.
func writeStatusTable(out io.Writer, report *StatusReport) error {
	if len(report.Rings) == 0 {
		_, err := fmt.Fprintln(out, "No ControllerRings found.")
		return err
	}
	var errs []error
	printf := func(w io.Writer, format string, a ...any) {
		_, err := fmt.Fprintf(w, format, a...)
		errs = append(errs, err)
	}
	for i, r := range report.Rings {
		if i > 0 {
			printf(out, "\n")
		}
		ready := "Ready=" + r.Ready
		if r.Reason != "" {
			ready += " (" + r.Reason + ")"
		}
		printf(out, "Ring %s: %s, %s, Leases in %s\n", r.Name, ready, r.Algorithm, r.LeaseNamespace)
		switch {
		case r.Slots != nil:
			writeSlotsHeader(printf, out, &r)
		case r.Source == sourceLabels:
			printf(out, "  %d instances (%d ready), %d objects, %d unassigned, %d drains in flight\n",
				len(r.Instances), r.ReadyInstances, r.Objects, r.Unassigned, r.Drains)
			printf(out, "  source: the labels, counted just now (--recount)\n")
		case r.ObservedGeneration == 0:
			printf(out, "  %d instances (%d ready), objects not counted\n", len(r.Instances), r.ReadyInstances)
			printf(out, "  source: the ring's status, not written yet\n")
		default:
			printf(out, "  %d instances (%d ready), %d objects, %d unassigned, %d drains in flight\n",
				len(r.Instances), r.ReadyInstances, r.Objects, r.Unassigned, r.Drains)
			printf(out, "  source: the ring's status (observed generation %d, ring generation %d)\n", r.ObservedGeneration, r.Generation)
		}
		if r.Ready != string(metav1.ConditionTrue) && r.Message != "" {
			printf(out, "  message: %s\n", oneLine(r.Message))
		}
		for _, s := range r.Stale {
			printf(out, "  status may be stale: %s\n", oneLine(s))
		}
		if len(r.Stale) > 0 {
			printf(out, "  the sharder may not be running: check its pods, or count from the labels with --recount\n")
		}
		if r.Source == sourceStatus && r.ObjectsWithoutLease > 0 {
			printf(out, "  %d objects are labelled with instances that have no Lease in the ring (--recount names them)\n", r.ObjectsWithoutLease)
		}
		for _, p := range r.Problems {
			printf(out, "  problem: %s\n", oneLine(p))
		}
		if len(r.Instances) > 0 {
			printf(out, "\n")
			errs = append(errs, writeInstances(out, report, &r))
		}
		if r.DrainList != nil {
			printf(out, "\n")
			errs = append(errs, writeDrains(out, report, &r))
		}
		if r.UnassignedList != nil {
			printf(out, "\n")
			errs = append(errs, writeUnassigned(out, report, &r))
		}
	}
	return errors.Join(errs...)
}

// writeInstances prints the table of the ring's instances.
func writeInstances(out io.Writer, report *StatusReport, r *RingReport) error {
	var errs []error
	printf := func(w io.Writer, format string, a ...any) {
		_, err := fmt.Fprintf(w, format, a...)
		errs = append(errs, err)
	}
	recounted := r.Source == sourceLabels
	assigned := r.Objects - r.Unassigned
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if r.Slots != nil {
		printf(tw, "  INSTANCE\tSTATE\tWEIGHT\tSLOTS\tRELEASING\tRENEWED\tNOTE\n")
		for _, inst := range r.Instances {
			weight := "-"
			if inst.State != stateUnknownInstance {
				weight = fmt.Sprint(inst.VirtualNodes)
			}
			printf(tw, "  %s\t%s\t%s\t%d\t%d\t%s\t%s\n", inst.Name, inst.State, weight,
				ptr.Deref(inst.Slots, 0), ptr.Deref(inst.ReleasingSlots, 0), renewed(inst.RenewTime, report.Time.Time), oneLine(inst.Note))
		}
		errs = append(errs, tw.Flush())
		return errors.Join(errs...)
	}
	if recounted {
		printf(tw, "  INSTANCE\tSTATE\tWEIGHT\tOBJECTS\tSHARE\tCONTROLLED\tDRAINS\tRENEWED\tNOTE\n")
	} else {
		printf(tw, "  INSTANCE\tSTATE\tWEIGHT\tOBJECTS\tSHARE\tRENEWED\tNOTE\n")
	}
	for _, inst := range r.Instances {
		share := "-"
		if assigned > 0 {
			share = fmt.Sprintf("%.1f%%", 100*float64(inst.Objects)/float64(assigned))
		}
		weight := "-"
		if inst.State != stateUnknownInstance {
			weight = fmt.Sprint(inst.VirtualNodes)
		}
		counts := ""
		if recounted {
			counts = fmt.Sprintf("%d\t%d\t", ptr.Deref(inst.Controlled, 0), ptr.Deref(inst.Drains, 0))
		}
		printf(tw, "  %s\t%s\t%s\t%d\t%s\t%s%s\t%s\n",
			inst.Name, inst.State, weight, inst.Objects, share, counts, renewed(inst.RenewTime, report.Time.Time), oneLine(inst.Note))
	}
	errs = append(errs, tw.Flush())
	return errors.Join(errs...)
}

// writeDrains prints the ring's drains in flight (--drains).
func writeDrains(out io.Writer, report *StatusReport, r *RingReport) error {
	if len(r.DrainList) == 0 {
		_, err := fmt.Fprintf(out, "  No drains in flight (listed from the labels just now).\n")
		return err
	}
	timeout := r.DrainTimeout.Duration
	_, err := fmt.Fprintf(out, "  Drains in flight (listed from the labels just now):\n")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	_, err2 := fmt.Fprintf(tw, "  NAMESPACE\tOBJECT\tINSTANCE\tTARGET\tSTARTED\tLABELLED\tNOTE\n")
	errs := []error{err, err2}
	for _, d := range r.DrainList {
		instance, target, started, labelled, note := d.Instance, d.Target, "-", "-", ""
		if instance == "" {
			instance = "-"
			note = "released by a forced move: assigned after the release grace"
		}
		if target == "" {
			target = "-"
			if d.Instance != "" {
				note = "no target: acknowledged by removing both labels"
			}
		}
		if d.Labelled != nil {
			labelled = ago(d.Labelled.Time, report.Time.Time)
		}
		switch overdue := d.Instance != "" && timeout > 0; {
		case d.Started != nil:
			started = ago(d.Started.Time, report.Time.Time)
			if overdue && report.Time.Sub(d.Started.Time) > timeout {
				note = joinNotes(note, fmt.Sprintf("started longer ago than drainTimeout %s: the leader forces it", timeout))
			}
		case d.Labelled != nil:
			if overdue && report.Time.Sub(d.Labelled.Time) > timeout {
				note = joinNotes(note, fmt.Sprintf("labelled longer ago than drainTimeout %s, start not recorded: forced when the leader's own count ends", timeout))
			}
		}
		_, err := fmt.Fprintf(tw, "  %s\t%s/%s\t%s\t%s\t%s\t%s\t%s\n", orDash(d.Namespace), d.Resource, d.Name, instance, target, started, labelled, note)
		errs = append(errs, err)
	}
	return errors.Join(append(errs, tw.Flush())...)
}

// writeUnassigned prints the ring's objects without an assignment
// (--unassigned).
func writeUnassigned(out io.Writer, report *StatusReport, r *RingReport) error {
	if len(r.UnassignedList) == 0 {
		_, err := fmt.Fprintf(out, "  No unassigned objects (listed from the labels just now).\n")
		return err
	}
	_, err := fmt.Fprintf(out, "  Unassigned objects (listed from the labels just now):\n")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	_, err2 := fmt.Fprintf(tw, "  NAMESPACE\tOBJECT\tCREATED\tNOTE\n")
	errs := []error{err, err2}
	for _, u := range r.UnassignedList {
		var note string
		switch {
		case u.Controller != "":
			note = "follows its controller " + u.Controller
		case u.Released:
			note = "released by a forced move: assigned after the release grace"
		}
		_, err := fmt.Fprintf(tw, "  %s\t%s/%s\t%s\t%s\n", orDash(u.Namespace), u.Resource, u.Name,
			duration.HumanDuration(report.Time.Sub(u.Created.Time))+" ago", note)
		errs = append(errs, err)
	}
	return errors.Join(append(errs, tw.Flush())...)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// renewed says how long before now the Lease was last renewed.
func renewed(t *metav1.MicroTime, now time.Time) string {
	if t == nil {
		return "-"
	}
	return ago(t.Time, now)
}

// ago says how long before now t was ("in ..." for a time after now,
// written by a clock ahead of the command's).
func ago(t, now time.Time) string {
	if t.After(now) {
		return "in " + duration.HumanDuration(t.Sub(now))
	}
	return duration.HumanDuration(now.Sub(t)) + " ago"
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// writeSlotsHeader prints the counts of a ring of unit Slots: its instances,
// its objects still without a slot label (the status's count) and its slot
// table.
func writeSlotsHeader(printf func(io.Writer, string, ...any), out io.Writer, r *RingReport) {
	if r.Source == sourceLabels {
		printf(out, "  %d instances (%d ready)\n", len(r.Instances), r.ReadyInstances)
	} else {
		printf(out, "  %d instances (%d ready), %d objects without a slot label\n", len(r.Instances), r.ReadyInstances, r.Unassigned)
	}
	switch t := r.Slots; {
	case t.Invalid != "":
		printf(out, "  slot table: invalid: %s\n", oneLine(t.Invalid))
	case t.Revision == 0:
		printf(out, "  slot table: %d slots, not written yet\n", t.Count)
	default:
		printf(out, "  slot table: revision %d, %d slots: %d granted, %d releasing, %d unassigned\n",
			t.Revision, t.Count, t.Granted, t.Releasing, t.Unassigned)
	}
	switch {
	case r.Source == sourceLabels:
		printf(out, "  source: the slot table in the ring's status; the Leases, read just now (--recount)\n")
	case r.ObservedGeneration == 0:
		printf(out, "  source: the ring's status, not written yet\n")
	default:
		printf(out, "  source: the ring's status (observed generation %d, ring generation %d)\n", r.ObservedGeneration, r.Generation)
	}
}
