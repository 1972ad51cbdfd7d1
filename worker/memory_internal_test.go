package worker

import "testing"

func TestDefaultBudget(t *testing.T) {
	ram := hostRAM()
	for _, c := range []struct {
		name     string
		dev      Device
		fraction float64
		hosts    int
		want     int64
	}{
		{"gpu: a fraction of its memory", Device{Kind: "gpu", Memory: 80 << 30}, 0.8, 1, 64 << 30},
		{"gpu of unknown memory: none", Device{Kind: "gpu"}, 0.8, 1, 0},
		{"no fraction: none", Device{Kind: "gpu", Memory: 80 << 30}, 0, 1, 0},
		{"cpu: the host's, shared", Device{Kind: "cpu"}, 0.5, 2, int64(float64(ram) * 0.5 / 2)},
	} {
		if got := defaultBudget(c.dev, c.fraction, c.hosts); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
	if ram <= 0 {
		t.Log("host memory unknown here: CPU devices get no default budget")
	}
}
