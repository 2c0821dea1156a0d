package localrun

import (
	"bufio"
	"fmt"
	"net"
	"testing"

	"github.com/onsi/gomega"
)

// echoServer answers each line with its name and the line.
func echoServer(t *testing.T, name string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s := bufio.NewScanner(c)
				for s.Scan() {
					fmt.Fprintf(c, "%s:%s\n", name, s.Text())
				}
			}()
		}
	}()
	return l
}

func ask(b *Balancer, line string) (string, error) {
	c, err := net.Dial("tcp", b.Address())
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := fmt.Fprintln(c, line); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func TestBalancerSkipsDeadBackends(t *testing.T) {
	g := gomega.NewWithT(t)
	a, z := echoServer(t, "a"), echoServer(t, "z")
	defer z.Close()
	b, err := NewBalancer()
	g.Expect(err).NotTo(gomega.HaveOccurred())
	defer b.Close()
	b.SetBackends(a.Addr().String(), z.Addr().String())

	seen := map[string]bool{}
	for range 6 {
		got, err := ask(b, "hi")
		g.Expect(err).NotTo(gomega.HaveOccurred())
		seen[got] = true
	}
	g.Expect(seen).To(gomega.Equal(map[string]bool{"a:hi\n": true, "z:hi\n": true}), "connections go to both backends")

	g.Expect(a.Close()).To(gomega.Succeed())
	for range 4 {
		g.Expect(ask(b, "again")).To(gomega.Equal("z:again\n"), "a dead backend is skipped")
	}
}
