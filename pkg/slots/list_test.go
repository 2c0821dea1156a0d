package slots

import (
	"math/rand/v2"
	"testing"

	. "github.com/onsi/gomega"
)

func TestListRoundTrip(t *testing.T) {
	g := NewWithT(t)
	g.Expect(FormatList([]int{0, 1, 2, 5, 7, 8, 100})).To(Equal("0-2,5,7-8,100"))
	g.Expect(FormatList(nil)).To(BeEmpty())
	rnd := rand.New(rand.NewPCG(5, 6))
	for range 500 {
		count := 1 + rnd.IntN(300)
		var set []int
		for s := range count {
			if rnd.IntN(4) > 0 {
				set = append(set, s)
			}
		}
		got, err := ParseList(FormatList(set), count)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got).To(Equal(set))
	}
}

func TestListRefused(t *testing.T) {
	g := NewWithT(t)
	for _, s := range []string{",", "1,", "-1", "1-", "1-1", "3-2", "3,2", "2,2", "1-3,3", "01", "+1", "a", "8", "0-8", " 1"} {
		_, err := ParseList(s, 8)
		g.Expect(err).To(HaveOccurred(), "%q", s)
	}
}
