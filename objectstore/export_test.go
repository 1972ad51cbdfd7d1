package objectstore

// LiveStats returns how many live reads fell back to another way, how many
// chunks live reads took from the stream before the live ones, and how
// many they took live.
func LiveStats() (fallbacks, backfilled, live int64) {
	return liveStats.fallbacks.Load(), liveStats.backfilled.Load(), liveStats.live.Load()
}
