// Package deploy holds what deploying jetfabric needs beside the binary and
// the compose file: the Grafana dashboard of the fabric's Prometheus series
// (grafana/jetfabric.json), embedded here so that tools can write it out
// and its test can check every query against the series the broker and
// the workers export.
package deploy

import _ "embed"

// GrafanaDashboard is grafana/jetfabric.json: a dashboard of the devices,
// the job queue, the checkpoints and the broker. Import it in Grafana and
// pick the Prometheus data source that scrapes the broker's and the
// workers' /metrics.
//
//go:embed grafana/jetfabric.json
var GrafanaDashboard []byte
