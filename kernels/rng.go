package kernels

import "math"

// Random is the counter-based generator behind every random op: 64 random
// bits for element i of the op keyed by key in a session seeded with seed.
// It is a pure function, identical on every backend. Workers key an op by
// its first output tensor id, which the client minted, so the same program
// draws the same numbers on every run and on replay.
func Random(seed, key, i uint64) uint64 {
	return RandomAt(RandomStream(seed, key), i)
}

// RandomStream and RandomAt split Random for loops over i:
// Random(seed, key, i) == RandomAt(RandomStream(seed, key), i).
func RandomStream(seed, key uint64) uint64 {
	return mix64(seed^0x6a09e667f3bcc909) ^ mix64(key+0x9e3779b97f4a7c15)
}

// RandomAt is Random for the stream of RandomStream.
func RandomAt(stream, i uint64) uint64 { return mix64(stream ^ (i * 0xbf58476d1ce4e5b9)) }

// mix64 is the splitmix64 finaliser.
func mix64(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Uniform01 maps 64 random bits to a float64 in [0, 1) with 53 bits.
func Uniform01(bits uint64) float64 { return float64(bits>>11) * (1.0 / (1 << 53)) }

// UniformAt is element i of a uniform op on [low, high).
func UniformAt(seed, key, i uint64, low, high float64) float64 {
	return low + (high-low)*Uniform01(Random(seed, key, i))
}

// NormalAt is element i of a normal op: Box-Muller on draws 2i and 2i+1,
// computed in float64.
func NormalAt(seed, key, i uint64, mean, std float64) float64 {
	u1 := 1 - Uniform01(Random(seed, key, 2*i)) // (0, 1]
	u2 := Uniform01(Random(seed, key, 2*i+1))
	return mean + std*math.Sqrt(-2*math.Log(u1))*math.Cos(2*math.Pi*u2)
}

// IsRandom reports whether op draws from the generator: its output
// depends on the session seed and on its output's id (Op.Seed, Op.Key),
// so the same op minting another id draws other bits.
func IsRandom(op string) bool {
	return op == OpUniform || op == OpNormal || op == OpBernoulli
}
