package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// The cluster's DNS: a small server of this command (cluster dns), run as a
// process on the node like the other components. It answers A queries for
// the names pods use, from Services and EndpointSlices:
//
//	<service>.<namespace>.svc.cluster.local           the ClusterIP, or every
//	                                                  ready endpoint of a headless Service
//	<hostname>.<service>.<namespace>.svc.cluster.local the endpoint with that
//	                                                  hostname (a StatefulSet's pod)
//
// and NXDOMAIN for anything else: it forwards nothing. Pods reach it through
// the Service kube-system/kube-dns (dnsSvcIP, port 53), whose EndpointSlice
// points at this machine's address and dnsPort; the kubelet writes that
// address into every pod's resolv.conf.
const (
	clusterDomain = "cluster.local"
	dnsSvcIP      = "10.97.0.10"
	dnsPort       = 16053
	dnsTTL        = 5
	// dnsBinary is where up copies this command to run it as the DNS
	// process: go run's binary is removed when up returns.
	dnsBinary = "cluster-dns"
)

// startDNS copies this command into the state folder and runs it as the DNS
// server, answering on ip:dnsPort.
func startDNS(l layout, ip string) (*proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	bin := l.path("bin", dnsBinary)
	if err := os.MkdirAll(filepath.Dir(bin), 0o750); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(self)
	if err != nil {
		return nil, err
	}
	_ = os.Remove(bin)
	if err := os.WriteFile(bin, data, 0o700); err != nil { //nolint:gosec // an executable, for root only
		return nil, err
	}
	return start(l, dnsBinary, bin, []string{"dns", "--dir", l.dir, "--listen", net.JoinHostPort(ip, fmt.Sprint(dnsPort))})
}

// ensureDNSService creates the Service kube-system/kube-dns and the
// EndpointSlice that sends its traffic to this machine's DNS server.
func ensureDNSService(ctx context.Context, cs kubernetes.Interface, ip string) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kube-dns", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: corev1.ServiceSpec{
			ClusterIP: dnsSvcIP,
			Ports: []corev1.ServicePort{
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53},
			},
		},
	}
	if _, err := cs.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kube-dns-node", Labels: map[string]string{
			discoveryv1.LabelServiceName: "kube-dns",
			discoveryv1.LabelManagedBy:   "sharder-cluster",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](dnsPort)},
			{Name: ptr.To("dns-tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](dnsPort)},
		},
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(slice.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// serveDNS runs the DNS server until ctx ends (cluster dns).
func serveDNS(ctx context.Context, l layout, listen string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", l.kubeconfig())
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(cs, 0)
	services := factory.Core().V1().Services().Lister()
	slices := factory.Discovery().V1().EndpointSlices().Lister()
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("syncing %v", typ)
		}
	}
	r := &dnsResolver{
		service: func(ns, name string) (*corev1.Service, error) { return services.Services(ns).Get(name) },
		slices: func(ns, name string) ([]*discoveryv1.EndpointSlice, error) {
			return slices.EndpointSlices(ns).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name}))
		},
	}

	var lc net.ListenConfig
	pc, err := lc.ListenPacket(ctx, "udp", listen)
	if err != nil {
		return err
	}
	ln, err := lc.Listen(ctx, "tcp", listen)
	if err != nil {
		_ = pc.Close()
		return err
	}
	go func() {
		<-ctx.Done()
		_ = pc.Close()
		_ = ln.Close()
	}()
	var wg sync.WaitGroup
	wg.Go(func() {
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
	})
	var acceptErr error
	for ctx.Err() == nil && acceptErr == nil {
		var conn net.Conn
		if conn, acceptErr = ln.Accept(); acceptErr == nil {
			go serveDNSConn(conn, r)
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil //nolint:nilerr // the listeners closed because ctx ended: a clean stop
	}
	return acceptErr
}

// serveDNSConn answers the length-prefixed queries of one TCP connection.
func serveDNSConn(conn net.Conn, r *dnsResolver) {
	defer func() { _ = conn.Close() }()
	for {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		var size uint16
		if err := binary.Read(conn, binary.BigEndian, &size); err != nil {
			return
		}
		query := make([]byte, size)
		if _, err := io.ReadFull(conn, query); err != nil {
			return
		}
		resp := r.answer(query, 65535)
		if resp == nil {
			return
		}
		if err := binary.Write(conn, binary.BigEndian, uint16(len(resp))); err != nil { //nolint:gosec // at most 65535 bytes
			return
		}
		if _, err := conn.Write(resp); err != nil {
			return
		}
	}
}

// dnsResolver answers from Services and EndpointSlices.
type dnsResolver struct {
	service func(ns, name string) (*corev1.Service, error)
	slices  func(ns, name string) ([]*discoveryv1.EndpointSlice, error)
}

// lookup returns the IPv4 addresses of name, and whether the name exists.
func (r *dnsResolver) lookup(name string) ([]netip.Addr, bool) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	rest, ok := strings.CutSuffix(name, ".svc."+clusterDomain)
	if !ok {
		return nil, false
	}
	parts := strings.Split(rest, ".")
	var host, svcName, ns string
	switch len(parts) {
	case 2:
		svcName, ns = parts[0], parts[1]
	case 3:
		host, svcName, ns = parts[0], parts[1], parts[2]
	default:
		return nil, false
	}
	svc, err := r.service(ns, svcName)
	if err != nil {
		return nil, false
	}
	if host == "" && svc.Spec.ClusterIP != corev1.ClusterIPNone && svc.Spec.ClusterIP != "" {
		ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil || !ip.Is4() {
			return nil, true
		}
		return []netip.Addr{ip}, true
	}
	slices, err := r.slices(ns, svcName)
	if err != nil {
		return nil, false
	}
	var out []netip.Addr
	found := host == ""
	for _, s := range slices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		for _, e := range s.Endpoints {
			if host != "" && ptr.Deref(e.Hostname, "") != host {
				continue
			}
			found = true
			// A headless Service that publishes endpoints before they
			// are ready has them marked ready in its slices.
			if !ptr.Deref(e.Conditions.Ready, true) && !svc.Spec.PublishNotReadyAddresses {
				continue
			}
			for _, a := range e.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil && ip.Is4() {
					out = append(out, ip)
				}
			}
		}
	}
	return out, found
}

// answer returns the response to a query, nil if it cannot be parsed. A
// UDP response that would exceed maxSize is truncated.
func (r *dnsResolver) answer(query []byte, maxSize int) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	q, err := p.Question()
	rcode := dnsmessage.RCodeSuccess
	var ips []netip.Addr
	if errors.Is(err, dnsmessage.ErrSectionDone) {
		rcode = dnsmessage.RCodeFormatError
	} else if err != nil {
		return nil
	}
	if rcode == dnsmessage.RCodeSuccess {
		var ok bool
		ips, ok = r.lookup(q.Name.String())
		if !ok {
			rcode = dnsmessage.RCodeNameError
		}
		if q.Type != dnsmessage.TypeA || q.Class != dnsmessage.ClassINET {
			ips = nil
		}
	}
	resp, err := build(h.ID, h.RecursionDesired, rcode, q, ips, false)
	if err != nil {
		return nil
	}
	if len(resp) > maxSize {
		resp, err = build(h.ID, h.RecursionDesired, rcode, q, nil, true)
		if err != nil {
			return nil
		}
	}
	return resp
}

func build(id uint16, rd bool, rcode dnsmessage.RCode, q dnsmessage.Question, ips []netip.Addr, truncated bool) ([]byte, error) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{
		ID: id, Response: true, Authoritative: true, RecursionDesired: rd, RCode: rcode, Truncated: truncated,
	})
	b.EnableCompression()
	if rcode != dnsmessage.RCodeFormatError {
		if err := b.StartQuestions(); err != nil {
			return nil, err
		}
		if err := b.Question(q); err != nil {
			return nil, err
		}
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	for _, ip := range ips {
		err := b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: dnsTTL}, dnsmessage.AResource{A: ip.As4()})
		if err != nil {
			return nil, err
		}
	}
	return b.Finish()
}
