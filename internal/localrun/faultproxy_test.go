package localrun

import (
	"bufio"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/onsi/gomega"
)

// lineConn is a connection through a proxy that sends and reads lines.
type lineConn struct {
	net.Conn
	r *bufio.Reader
}

func dialLines(t *testing.T, p *FaultProxy) *lineConn {
	t.Helper()
	c, err := net.Dial("tcp", p.Address())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &lineConn{Conn: c, r: bufio.NewReader(c)}
}

// roundTrip sends line and returns the answer, or an error once timeout
// passed.
func (c *lineConn) roundTrip(line string, timeout time.Duration) (string, error) {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if _, err := fmt.Fprintln(c, line); err != nil {
		return "", err
	}
	return c.r.ReadString('\n')
}

func TestFaultProxy(t *testing.T) {
	g := gomega.NewWithT(t)
	backend := echoServer(t, "api")
	defer backend.Close()
	p, err := NewFaultProxy(backend.Addr().String())
	g.Expect(err).NotTo(gomega.HaveOccurred())
	defer p.Close()

	open := dialLines(t, p)
	g.Expect(open.roundTrip("one", 5*time.Second)).To(gomega.Equal("api:one\n"))

	// A blackhole holds the data of open connections and new ones alike,
	// and delivers it when it heals.
	p.Set(Blackhole, 0)
	_, err = open.roundTrip("held", 300*time.Millisecond)
	g.Expect(err).To(gomega.HaveOccurred(), "nothing passes a blackhole")
	fresh := dialLines(t, p)
	_, err = fresh.roundTrip("new", 300*time.Millisecond)
	g.Expect(err).To(gomega.HaveOccurred(), "nothing passes a blackhole")
	p.Set(Pass, 0)
	g.Expect(open.SetDeadline(time.Now().Add(5 * time.Second))).To(gomega.Succeed())
	g.Expect(open.r.ReadString('\n')).To(gomega.Equal("api:held\n"), "held data arrives once the partition heals")
	g.Expect(fresh.SetDeadline(time.Now().Add(5 * time.Second))).To(gomega.Succeed())
	g.Expect(fresh.r.ReadString('\n')).To(gomega.Equal("api:new\n"))

	// A delay slows each chunk, both ways.
	p.Set(Delay, 200*time.Millisecond)
	start := time.Now()
	g.Expect(open.roundTrip("slow", 5*time.Second)).To(gomega.Equal("api:slow\n"))
	g.Expect(time.Since(start)).To(gomega.BeNumerically(">=", 400*time.Millisecond))
	p.Set(Pass, 0)

	// Refuse closes what is open and every new connection.
	p.Set(Refuse, 0)
	_, err = open.roundTrip("gone", 5*time.Second)
	g.Expect(err).To(gomega.HaveOccurred(), "an open connection is closed")
	_, err = dialLines(t, p).roundTrip("refused", 5*time.Second)
	g.Expect(err).To(gomega.HaveOccurred(), "a new connection is closed")
	p.Set(Pass, 0)
	again := dialLines(t, p)
	g.Expect(again.roundTrip("back", 5*time.Second)).To(gomega.Equal("api:back\n"))

	// Reset closes the open connections once.
	p.Reset()
	_, err = again.roundTrip("reset", 5*time.Second)
	g.Expect(err).To(gomega.HaveOccurred())
	g.Expect(dialLines(t, p).roundTrip("after", 5*time.Second)).To(gomega.Equal("api:after\n"))
}
