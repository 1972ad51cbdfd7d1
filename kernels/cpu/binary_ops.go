package cpu

// Kernels of the cheap binary ops, one loop per mode of a run (see addK):
// the op is written out in each loop so that nothing is called per element.

// maxK is maximum; the builtin max gives NaN if either operand is NaN.
func maxK[T number](y []T, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = max(a[i], b[i])
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = max(a[i], s)
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = max(s, b[i])
		}
	default:
		y[0] = max(a[0], b[0])
		fill(y)
	}
}

// minK is minimum, likewise.
func minK[T number](y []T, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = min(a[i], b[i])
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = min(a[i], s)
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = min(s, b[i])
		}
	default:
		y[0] = min(a[0], b[0])
		fill(y)
	}
}

// andK is bitwise and.
func andK[T integer](y []T, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = a[i] & b[i]
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = a[i] & s
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = s & b[i]
		}
	default:
		y[0] = a[0] & b[0]
		fill(y)
	}
}

// orK is bitwise or.
func orK[T integer](y []T, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = a[i] | b[i]
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = a[i] | s
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = s | b[i]
		}
	default:
		y[0] = a[0] | b[0]
		fill(y)
	}
}

// xorK is bitwise xor.
func xorK[T integer](y []T, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = a[i] ^ b[i]
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = a[i] ^ s
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = s ^ b[i]
		}
	default:
		y[0] = a[0] ^ b[0]
		fill(y)
	}
}

// landK is logical and of bools.
func landK[T ~uint8](y []uint8, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = b2u(a[i] != 0 && b[i] != 0)
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = b2u(a[i] != 0 && s != 0)
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = b2u(s != 0 && b[i] != 0)
		}
	default:
		y[0] = b2u(a[0] != 0 && b[0] != 0)
		fill(y)
	}
}

// lorK is logical or of bools.
func lorK[T ~uint8](y []uint8, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = b2u(a[i] != 0 || b[i] != 0)
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = b2u(a[i] != 0 || s != 0)
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = b2u(s != 0 || b[i] != 0)
		}
	default:
		y[0] = b2u(a[0] != 0 || b[0] != 0)
		fill(y)
	}
}

// lxorK is logical xor of bools.
func lxorK[T ~uint8](y []uint8, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = b2u((a[i] != 0) != (b[i] != 0))
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = b2u((a[i] != 0) != (s != 0))
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = b2u((s != 0) != (b[i] != 0))
		}
	default:
		y[0] = b2u((a[0] != 0) != (b[0] != 0))
		fill(y)
	}
}

// eqK is a == b.
func eqK[T number](y []uint8, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = b2u(a[i] == b[i])
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = b2u(a[i] == s)
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = b2u(s == b[i])
		}
	default:
		y[0] = b2u(a[0] == b[0])
		fill(y)
	}
}

// neK is a != b.
func neK[T number](y []uint8, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = b2u(a[i] != b[i])
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = b2u(a[i] != s)
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = b2u(s != b[i])
		}
	default:
		y[0] = b2u(a[0] != b[0])
		fill(y)
	}
}

// ltK is a < b.
func ltK[T number](y []uint8, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = b2u(a[i] < b[i])
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = b2u(a[i] < s)
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = b2u(s < b[i])
		}
	default:
		y[0] = b2u(a[0] < b[0])
		fill(y)
	}
}

// leK is a <= b.
func leK[T number](y []uint8, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = b2u(a[i] <= b[i])
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = b2u(a[i] <= s)
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = b2u(s <= b[i])
		}
	default:
		y[0] = b2u(a[0] <= b[0])
		fill(y)
	}
}

// gtK is a > b.
func gtK[T number](y []uint8, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = b2u(a[i] > b[i])
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = b2u(a[i] > s)
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = b2u(s > b[i])
		}
	default:
		y[0] = b2u(a[0] > b[0])
		fill(y)
	}
}

// geK is a >= b.
func geK[T number](y []uint8, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = b2u(a[i] >= b[i])
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = b2u(a[i] >= s)
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = b2u(s >= b[i])
		}
	default:
		y[0] = b2u(a[0] >= b[0])
		fill(y)
	}
}
