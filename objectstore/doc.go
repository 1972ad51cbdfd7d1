// Package objectstore keeps jetfabric's tensor blobs in the JetStream
// object store.
package objectstore
