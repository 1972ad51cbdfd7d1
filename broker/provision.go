package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/subjects"
)

// ProvisionStreams creates or updates the ops stream and the control and
// transfer buckets. It is idempotent: running it again with the same
// settings changes nothing, so every node of a cluster may run it.
func ProvisionStreams(ctx context.Context, js jetstream.JetStream, names subjects.Names, p Provision) error {
	if err := p.validate(p.OpsMaxMsgSize); err != nil {
		return err
	}
	opsSubjects, jobsSubjects := names.OpsShapes(), []string{names.JobsAll()}
	if p.Tenants {
		opsSubjects = append(opsSubjects, names.TenantOpsAll())
		jobsSubjects = append(jobsSubjects, names.TenantJobsAll())
	}
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        names.OpsStream(),
		Description: "jetfabric op frames, one subject per device and session; the execution log",
		Subjects:    opsSubjects,
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardNew,
		MaxBytes:    orUnlimited(p.OpsMaxBytes),
		MaxAge:      p.OpsMaxAge,
		MaxMsgSize:  p.OpsMaxMsgSize,
		Replicas:    p.Replicas,
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
	})
	if err != nil {
		return fmt.Errorf("broker: provision stream %s: %w", names.OpsStream(), err)
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        names.JobsStream(),
		Description: "jetfabric jobs: stateless op programs, each taken by one worker of its device kind",
		Subjects:    jobsSubjects,
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardNew,
		MaxBytes:    orUnlimited(p.OpsMaxBytes),
		MaxMsgSize:  p.OpsMaxMsgSize,
		Replicas:    p.Replicas,
	})
	if err != nil {
		return fmt.Errorf("broker: provision stream %s: %w", names.JobsStream(), err)
	}
	_, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         names.CtrlBucket(),
		Description:    "jetfabric device registry, leases and checkpoints",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       p.Replicas,
		LimitMarkerTTL: time.Second,
	})
	if err != nil {
		return fmt.Errorf("broker: provision bucket %s: %w", names.CtrlBucket(), err)
	}
	_, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:       names.GraphBucket(),
		Description:  "jetfabric captured graphs, keyed by the SHA-256 of their definition",
		History:      1,
		MaxValueSize: maxGraphBytes,
		Storage:      jetstream.FileStorage,
		Replicas:     p.Replicas,
	})
	if err != nil {
		return fmt.Errorf("broker: provision bucket %s: %w", names.GraphBucket(), err)
	}
	_, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      names.XferBucket(),
		Description: "jetfabric tensor transfers, large uploads and large results",
		TTL:         p.XferTTL,
		MaxBytes:    orUnlimited(p.XferMaxBytes),
		Storage:     p.XferStorage,
		Replicas:    p.Replicas,
	})
	if err != nil {
		return fmt.Errorf("broker: provision bucket %s: %w", names.XferBucket(), err)
	}
	_, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      names.ResultsBucket(),
		Description: "jetfabric large results, each read once; in memory",
		TTL:         p.ResultsTTL,
		MaxBytes:    orUnlimited(p.ResultsMaxBytes),
		Storage:     jetstream.MemoryStorage,
		Replicas:    p.Replicas,
	})
	if err != nil {
		return fmt.Errorf("broker: provision bucket %s: %w", names.ResultsBucket(), err)
	}
	_, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      names.CkptBucket(),
		Description: "jetfabric device checkpoints: every session's tensors at a stream sequence",
		Storage:     jetstream.FileStorage,
		Replicas:    p.Replicas,
	})
	if err != nil {
		return fmt.Errorf("broker: provision bucket %s: %w", names.CkptBucket(), err)
	}
	return nil
}

// WaitProvisioned waits until the streams and buckets exist, for
// processes (workers, clients) that use a broker someone else provisions.
func WaitProvisioned(ctx context.Context, js jetstream.JetStream, names subjects.Names) error {
	for {
		err := checkProvisioned(ctx, js, names)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("broker: fabric not provisioned: %w (last: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func checkProvisioned(ctx context.Context, js jetstream.JetStream, names subjects.Names) error {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := js.Stream(cctx, names.OpsStream()); err != nil {
		return fmt.Errorf("stream %s: %w", names.OpsStream(), err)
	}
	if _, err := js.Stream(cctx, names.JobsStream()); err != nil {
		return fmt.Errorf("stream %s: %w", names.JobsStream(), err)
	}
	if _, err := js.KeyValue(cctx, names.CtrlBucket()); err != nil {
		return fmt.Errorf("bucket %s: %w", names.CtrlBucket(), err)
	}
	for _, b := range []string{names.XferBucket(), names.ResultsBucket(), names.CkptBucket()} {
		if _, err := js.ObjectStore(cctx, b); err != nil {
			if errors.Is(err, jetstream.ErrBucketNotFound) {
				return fmt.Errorf("bucket %s: %w", b, err)
			}
			return err
		}
	}
	return nil
}

// maxGraphBytes bounds a stored graph definition, as codec.MaxGraphBytes
// does on both ends.
const maxGraphBytes = 1 << 20

func orUnlimited(n int64) int64 {
	if n == 0 {
		return -1
	}
	return n
}
