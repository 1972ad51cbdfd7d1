package cpu

import "sync"

// minCached is the smallest buffer, in 8-byte words, that Free keeps for
// reuse: smaller ones are cheap to allocate fresh.
const minCached = (64 << 10) / 8

// cache keeps freed large allocations by size, up to a bound in bytes.
// Tensors tend to repeat their sizes (the same shapes every step of a
// loop), so an exact-size match is the common case.
type cache struct {
	mu    sync.Mutex
	limit int64
	held  int64
	free  map[int][][]uint64
}

func newCache(limit int64) *cache {
	return &cache{limit: limit, free: map[int][][]uint64{}}
}

// take returns a cached allocation of exactly n words, or nil.
func (c *cache) take(n int) []uint64 {
	if n < minCached {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.free[n]
	if len(l) == 0 {
		return nil
	}
	w := l[len(l)-1]
	l[len(l)-1] = nil
	if len(l) == 1 {
		delete(c.free, n)
	} else {
		c.free[n] = l[:len(l)-1]
	}
	c.held -= int64(n) * 8
	return w
}

// put keeps w for reuse if it is large and the bound allows.
func (c *cache) put(w []uint64) {
	if len(w) < minCached {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held+int64(len(w))*8 > c.limit {
		return // dropped: the garbage collector takes it
	}
	c.free[len(w)] = append(c.free[len(w)], w)
	c.held += int64(len(w)) * 8
}

// drop empties the cache and returns the bytes it held.
func (c *cache) drop() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.held
	clear(c.free)
	c.held = 0
	return n
}
