package localrun

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Balancer forwards TCP connections on a loopback port to one of several
// backends, skipping those that refuse connections: it stands in for the
// Service in front of the sharder replicas' webhook servers, so the API
// server keeps reaching a live replica when one dies. TLS passes through
// unchanged.
type Balancer struct {
	listener net.Listener
	next     atomic.Uint64

	mu       sync.Mutex
	backends []string
	conns    map[net.Conn]struct{}
	closed   bool
}

// NewBalancer listens on 127.0.0.1 on a free port.
func NewBalancer() (*Balancer, error) {
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &Balancer{listener: l, conns: map[net.Conn]struct{}{}}
	go b.serve()
	return b, nil
}

// Address returns the host:port the balancer listens on.
func (b *Balancer) Address() string { return b.listener.Addr().String() }

// Port returns the port the balancer listens on.
func (b *Balancer) Port() int { return b.listener.Addr().(*net.TCPAddr).Port }

// SetBackends replaces the backend addresses (host:port).
func (b *Balancer) SetBackends(addrs ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backends = append([]string(nil), addrs...)
}

// AddBackend adds a backend address.
func (b *Balancer) AddBackend(addr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backends = append(b.backends, addr)
}

// Close stops listening and closes every forwarded connection.
func (b *Balancer) Close() error {
	b.mu.Lock()
	b.closed = true
	for c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	return b.listener.Close()
}

func (b *Balancer) serve() {
	for {
		c, err := b.listener.Accept()
		if err != nil {
			return
		}
		go b.forward(c)
	}
}

func (b *Balancer) track(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.conns[c] = struct{}{}
	return true
}

func (b *Balancer) untrack(c net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.conns, c)
}

func (b *Balancer) dial() (net.Conn, error) {
	b.mu.Lock()
	backends := append([]string(nil), b.backends...)
	b.mu.Unlock()
	if len(backends) == 0 {
		return nil, errors.New("no backends")
	}
	n := uint64(len(backends))
	start := b.next.Add(1) % n
	dialer := net.Dialer{Timeout: time.Second}
	var errs []error
	for i := range n {
		addr := backends[(start+i)%n]
		c, err := dialer.DialContext(context.Background(), "tcp", addr)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (b *Balancer) forward(client net.Conn) {
	defer client.Close()
	if !b.track(client) {
		return
	}
	defer b.untrack(client)
	server, err := b.dial()
	if err != nil {
		return
	}
	defer server.Close()
	if !b.track(server) {
		return
	}
	defer b.untrack(server)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
}
