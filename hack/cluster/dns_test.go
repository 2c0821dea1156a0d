package main

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

// testResolver knows a ClusterIP Service db/main-client and a headless
// Service db/main-peer with two StatefulSet pods.
func testResolver() *dnsResolver {
	services := map[string]*corev1.Service{
		"db/main-client": {Spec: corev1.ServiceSpec{ClusterIP: "10.97.3.4"}},
		"db/main-peer":   {Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, PublishNotReadyAddresses: true}},
	}
	slices := map[string][]*discoveryv1.EndpointSlice{
		"db/main-peer": {{
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.98.0.5"}, Hostname: ptr.To("main-0"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
				{Addresses: []string{"10.98.0.6"}, Hostname: ptr.To("main-1"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
			},
		}},
	}
	return &dnsResolver{
		service: func(ns, name string) (*corev1.Service, error) {
			if s, ok := services[ns+"/"+name]; ok {
				return s, nil
			}
			return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "services"}, name)
		},
		slices: func(ns, name string) ([]*discoveryv1.EndpointSlice, error) { return slices[ns+"/"+name], nil },
	}
}

func TestDNSLookup(t *testing.T) {
	r := testResolver()
	for name, want := range map[string][]string{
		"main-client.db.svc.cluster.local.":             {"10.97.3.4"},
		"MAIN-0.main-peer.db.svc.cluster.local.":        {"10.98.0.5"},
		"main-1.main-peer.db.svc.cluster.local":         {"10.98.0.6"},
		"main-peer.db.svc.cluster.local.":               {"10.98.0.5", "10.98.0.6"},
		"main-2.main-peer.db.svc.cluster.local.":        nil,
		"main-0.main-peer.db.svc.db.svc.cluster.local.": nil,
		"other.db.svc.cluster.local.":                   nil,
		"example.com.":                                  nil,
	} {
		ips, found := r.lookup(name)
		if found != (want != nil) {
			t.Errorf("lookup(%s) found = %v; want %v", name, found, want != nil)
		}
		var got []string
		for _, ip := range ips {
			got = append(got, ip.String())
		}
		if len(got) != len(want) {
			t.Errorf("lookup(%s) = %v; want %v", name, got, want)
			continue
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("lookup(%s) = %v; want %v", name, got, want)
			}
		}
	}
}

// TestDNSServer asks the server over UDP with Go's own resolver, as a pod's
// resolver would, for names found and not found.
func TestDNSServer(t *testing.T) {
	r := testResolver()
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(t.Context(), "udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := r.answer(buf[:n], 512); resp != nil {
				_, _ = pc.WriteTo(resp, addr)
			}
		}
	}()
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
	ips, err := res.LookupNetIP(t.Context(), "ip4", "main-0.main-peer.db.svc.cluster.local.")
	if err != nil || len(ips) != 1 || ips[0] != netip.MustParseAddr("10.98.0.5") {
		t.Errorf("main-0: %v, %v", ips, err)
	}
	// Both families, as a pod's resolver asks: the A answer and an empty AAAA.
	addrs, err := res.LookupHost(t.Context(), "main-client.db.svc.cluster.local.")
	if err != nil || len(addrs) != 1 || addrs[0] != "10.97.3.4" {
		t.Errorf("main-client: %v, %v", addrs, err)
	}
	_, err = res.LookupHost(t.Context(), "nothing.db.svc.cluster.local.")
	var dnsErr *net.DNSError
	if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
		t.Errorf("nothing: %v; want not found", err)
	}
	// A query the parser cannot read gets no answer.
	if resp := r.answer([]byte{1, 2, 3}, 512); resp != nil {
		t.Errorf("garbage answered: %v", resp)
	}
}
