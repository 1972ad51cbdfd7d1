// A benchmark kept out of the jetfabric module, so that gonum, which
// jetfabric does not depend on, is only measured against, never built in.
module github.com/jetfabric/jetfabric/bench/gonum

go 1.26.0

replace github.com/jetfabric/jetfabric => ../..

require (
	github.com/jetfabric/jetfabric v0.0.0-00010101000000-000000000000
	gonum.org/v1/gonum v0.17.0
)
