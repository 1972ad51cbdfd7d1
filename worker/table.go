package worker

import "iter"

// table is a session's tensor table: ids to entries. Clients mint ids in
// order (a session counts up from 1, a replay reserves a run of them), so
// most live ids fall in a window that a slice indexes directly, with no
// hashing and no probing; the others go to a map. A window that has grown
// mostly empty is replaced by one starting at the next id set, its live
// entries moved to the map.
type table struct {
	lo     uint64  // the id of dense[0]
	dense  []entry // present where t or fail is set
	live   int     // present entries in dense
	sparse map[uint64]entry
}

// maxDenseGap bounds how far past the window an id may be and still grow
// it rather than go to the map.
const maxDenseGap = 1 << 12

func (e entry) present() bool { return e.t != nil || e.fail != nil }

// get returns id's entry and whether there is one.
func (tb *table) get(id uint64) (entry, bool) {
	if i := id - tb.lo; i < uint64(len(tb.dense)) {
		e := tb.dense[i]
		return e, e.present()
	}
	e, ok := tb.sparse[id]
	return e, ok
}

// has reports whether id has an entry.
func (tb *table) has(id uint64) bool {
	_, ok := tb.get(id)
	return ok
}

// set gives id the entry e, which must be present.
func (tb *table) set(id uint64, e entry) {
	if i := id - tb.lo; i < uint64(len(tb.dense)) {
		if !tb.dense[i].present() {
			tb.live++
		}
		tb.dense[i] = e
		return
	}
	if _, ok := tb.sparse[id]; ok {
		tb.sparse[id] = e
		return
	}
	if tb.live == 0 {
		clear(tb.dense)
		tb.lo, tb.dense = id, tb.dense[:0]
	}
	if id >= tb.lo && id-tb.lo < uint64(len(tb.dense))+maxDenseGap {
		n := int(id-tb.lo) + 1
		if n > cap(tb.dense) && tb.live < len(tb.dense)/4 {
			// Mostly empty: a new window from id, the old one's
			// entries to the map.
			tb.rebase(id)
			n = 1
		}
		for len(tb.dense) < n {
			tb.dense = append(tb.dense, entry{})
		}
		tb.dense[n-1] = e
		tb.live++
		return
	}
	if tb.sparse == nil {
		tb.sparse = map[uint64]entry{}
	}
	tb.sparse[id] = e
}

// rebase moves the window's entries to the map and starts an empty
// window at lo.
func (tb *table) rebase(lo uint64) {
	for i, e := range tb.dense {
		if e.present() {
			if tb.sparse == nil {
				tb.sparse = map[uint64]entry{}
			}
			tb.sparse[tb.lo+uint64(i)] = e
		}
	}
	clear(tb.dense)
	tb.lo, tb.dense, tb.live = lo, tb.dense[:0], 0
}

// del removes id's entry, if any.
func (tb *table) del(id uint64) {
	if i := id - tb.lo; i < uint64(len(tb.dense)) {
		if tb.dense[i].present() {
			tb.dense[i] = entry{}
			if tb.live--; tb.live == 0 && cap(tb.dense) > 1<<16 {
				tb.dense = nil // let a large empty window's memory go
			}
		}
		return
	}
	delete(tb.sparse, id)
}

// len is the number of entries.
func (tb *table) len() int { return tb.live + len(tb.sparse) }

// all yields every entry. The loop's body may delete the entry it is
// given.
func (tb *table) all() iter.Seq2[uint64, entry] {
	return func(yield func(uint64, entry) bool) {
		// The length is read again each time round: a delete by the body
		// may drop an emptied window.
		for i := 0; i < len(tb.dense); i++ {
			if e := tb.dense[i]; e.present() && !yield(tb.lo+uint64(i), e) {
				return
			}
		}
		for id, e := range tb.sparse {
			if !yield(id, e) {
				return
			}
		}
	}
}
