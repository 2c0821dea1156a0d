package slots

import (
	"fmt"
	"strconv"
	"strings"
)

// FormatList returns ascending slots as the slot table writes them: comma-
// separated numbers and ranges of consecutive slots ("0-63,128,130-131").
// slots must be ascending without repeats.
func FormatList(slots []int) string {
	var b strings.Builder
	for i := 0; i < len(slots); {
		j := i
		for j+1 < len(slots) && slots[j+1] == slots[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(slots[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(slots[j]))
		}
		i = j + 1
	}
	return b.String()
}

// ParseList parses a slot list as FormatList writes it, for count slots.
// It refuses a slot outside [0, count), a range written backwards, and
// slots out of order or repeated, so that a table parses to one meaning.
func ParseList(s string, count int) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for part := range strings.SplitSeq(s, ",") {
		first, last, isRange := strings.Cut(part, "-")
		lo, err := parseSlot(first, count)
		if err != nil {
			return nil, err
		}
		hi := lo
		if isRange {
			if hi, err = parseSlot(last, count); err != nil {
				return nil, err
			}
			if hi <= lo {
				return nil, fmt.Errorf("slot range %q is not ascending", part)
			}
		}
		if len(out) > 0 && lo <= out[len(out)-1] {
			return nil, fmt.Errorf("slot %d is out of order or repeated in %q", lo, s)
		}
		for slot := lo; slot <= hi; slot++ {
			out = append(out, slot)
		}
	}
	return out, nil
}

func parseSlot(s string, count int) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= count || strconv.Itoa(n) != s {
		return 0, fmt.Errorf("%q is not a slot of %d", s, count)
	}
	return n, nil
}
