package localrun

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// Fault is what a FaultProxy does to the traffic it forwards.
type Fault int

const (
	// Pass forwards everything.
	Pass Fault = iota
	// Refuse closes every open connection and every new one at once, as
	// an API server that is down (or restarting) looks to its clients.
	Refuse
	// Blackhole accepts connections and forwards nothing in either
	// direction, holding what it reads until the fault ends, as a network
	// partition does: requests and watches stall rather than fail, and
	// resume when the partition heals (unless a side gave up meanwhile).
	Blackhole
	// Delay forwards every chunk of data late by the proxy's delay, both
	// ways.
	Delay
)

func (f Fault) String() string {
	switch f {
	case Pass:
		return "pass"
	case Refuse:
		return "refuse"
	case Blackhole:
		return "blackhole"
	case Delay:
		return "delay"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// FaultProxy forwards TCP connections on a loopback port to one backend
// (the API server), and injects faults into them on demand: one process's
// connection to the API server can be cut, stalled or slowed while
// everything else keeps working. TLS passes through unchanged, so clients
// keep authenticating with their own certificates; the backend's serving
// certificate must be valid for 127.0.0.1.
type FaultProxy struct {
	listener net.Listener
	backend  string

	mu sync.Mutex
	// fault and delay are the current fault; changed wakes the copies
	// waiting for a fault to end (closed and replaced on every change).
	fault   Fault
	delay   time.Duration
	changed chan struct{}
	conns   map[net.Conn]struct{}
	closed  bool
}

// NewFaultProxy listens on 127.0.0.1 on a free port and forwards to
// backend (host:port).
func NewFaultProxy(backend string) (*FaultProxy, error) {
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &FaultProxy{listener: l, backend: backend, changed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

// Address returns the host:port the proxy listens on.
func (p *FaultProxy) Address() string { return p.listener.Addr().String() }

// Set changes the fault; delay is used by Delay only. Refuse closes every
// open connection.
func (p *FaultProxy) Set(f Fault, delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault, p.delay = f, delay
	close(p.changed)
	p.changed = make(chan struct{})
	if f == Refuse {
		p.closeConnsLocked()
	}
}

// Reset closes every open connection once, as a restarted API server
// does; new connections pass as the current fault says.
func (p *FaultProxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeConnsLocked()
}

// Close stops listening and closes every forwarded connection.
func (p *FaultProxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.closeConnsLocked()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	return p.listener.Close()
}

func (p *FaultProxy) closeConnsLocked() {
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

func (p *FaultProxy) serve() {
	for {
		c, err := p.listener.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

// track registers c unless the proxy is closed or refusing.
func (p *FaultProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.fault == Refuse {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *FaultProxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// state returns the current fault, its delay and the channel closed at
// its next change.
func (p *FaultProxy) state() (Fault, time.Duration, <-chan struct{}, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fault, p.delay, p.changed, p.closed
}

func (p *FaultProxy) forward(client net.Conn) {
	defer client.Close()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	dialer := net.Dialer{Timeout: time.Second}
	server, err := dialer.DialContext(context.Background(), "tcp", p.backend)
	if err != nil {
		return
	}
	defer server.Close()
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	go func() { p.pipe(server, client); done <- struct{}{} }()
	go func() { p.pipe(client, server); done <- struct{}{} }()
	<-done
	// One side ended: end the other too.
	_ = client.Close()
	_ = server.Close()
	<-done
}

// pipe copies src to dst chunk by chunk, applying the fault to each.
func (p *FaultProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.hold() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// hold waits as the current fault says before a chunk is forwarded; false
// when the chunk must be dropped with its connection.
func (p *FaultProxy) hold() bool {
	for {
		fault, delay, changed, closed := p.state()
		switch {
		case closed || fault == Refuse:
			return false
		case fault == Blackhole:
			<-changed
		case fault == Delay:
			t := time.NewTimer(delay)
			select {
			case <-t.C:
				return true
			case <-changed:
				t.Stop()
			}
		default:
			return true
		}
	}
}

// WriteProxiedKubeconfig writes a copy of the kubeconfig file src to dst
// that reaches the API server at apiServer (host:port, as in src) through
// proxy instead.
func WriteProxiedKubeconfig(src, dst, apiServer string, proxy *FaultProxy) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	text := string(data)
	if !strings.Contains(text, apiServer) {
		return errors.New("kubeconfig " + src + " does not name the API server " + apiServer)
	}
	return os.WriteFile(dst, []byte(strings.ReplaceAll(text, apiServer, proxy.Address())), 0o600)
}
