package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
)

// WithCreds authenticates with a creds file (a JWT and an nkey seed, as
// `jetfabric tenant add` writes them, and as the nats CLI reads them).
// The tenant is the one the JWT names, unless WithTenant says otherwise;
// the service user's file makes a client of the single-user layout.
// Expired credentials fail here, naming the file and the time.
func WithCreds(path string) Option {
	return func(o *options) error {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("%w: creds: %v", ErrInvalidOption, err)
		}
		name, expires, err := tenant.NameOf(b)
		if err != nil {
			return fmt.Errorf("%w: creds %s: %v", ErrInvalidOption, path, err)
		}
		if !expires.IsZero() && !time.Now().Before(expires) {
			return fmt.Errorf("%w: the credentials in %s expired at %s", ErrCredentials, path, expires.UTC().Format(time.RFC3339))
		}
		o.creds, o.credsTenant = path, name
		o.natsOpts = append(o.natsOpts, nats.UserCredentials(path))
		return nil
	}
}

// WithTenant sets the tenant the client works as: its subjects, inbox
// prefix and object bucket (see docs/PROTOCOL.md, Tenants). WithCreds
// infers it from the credentials.
func WithTenant(name string) Option {
	return func(o *options) error {
		if err := subjects.ValidateTenant(name); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidOption, err)
		}
		o.tenant = name
		return nil
	}
}

// Tenant is the tenant the client works as ("" for the single-user layout).
func (c *Client) Tenant() string { return c.names.Tenant() }

// connectError says why a connection was refused: the credentials, named,
// or what NewConnectError finds (TLS).
func connectError(url string, o options, err error) error {
	if o.creds != "" && (errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || strings.Contains(strings.ToLower(err.Error()), "authorization")) {
		who := "the service user"
		if o.credsTenant != "" {
			who = "tenant " + o.credsTenant
		}
		return fmt.Errorf("%w: %s refused the credentials of %s in %s (not signed by this fabric's account, expired or revoked): %w", ErrCredentials, url, who, o.creds, NewConnectError(url, err))
	}
	return NewConnectError(url, err)
}

// errKeyNotFound is a direct get's answer when the subject holds nothing.
var errKeyNotFound = errors.New("client: no message on the subject")

// directGet reads the last message on subject in stream with a direct
// get in its subject form, the one a tenant's permissions allow.
func (c *Client) directGet(ctx context.Context, stream, subject string) (*nats.Msg, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	m, err := c.nc.RequestWithContext(ctx, subjects.DirectGet(stream, subject), nil)
	if err != nil {
		return nil, fmt.Errorf("client: read %s: %w", subject, err)
	}
	switch status := m.Header.Get("Status"); status {
	case "":
		return m, nil
	case "404":
		return nil, errKeyNotFound
	default:
		return nil, fmt.Errorf("client: read %s: status %s %s", subject, status, m.Header.Get("Description"))
	}
}

// registryEntry reads a device's registry entry's value.
func (c *Client) registryEntry(ctx context.Context, device string) ([]byte, error) {
	m, err := c.directGet(ctx, c.names.CtrlStream(), c.names.CtrlSubject(subjects.DeviceKey(device)))
	if err != nil {
		return nil, err
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil, errKeyNotFound
	}
	return m.Data, nil
}

// tenantDevice is device's entry in the registry service's list (the
// stream leader's view), and whether the list holds it.
func (c *Client) tenantDevice(ctx context.Context, device string) (Device, bool, error) {
	devs, err := c.tenantDevices(ctx)
	if err != nil {
		return Device{}, false, err
	}
	for _, d := range devs {
		if d.Name == device {
			return d, true, nil
		}
	}
	return Device{}, false, nil
}

// tenantName is the tenant of the options: WithTenant's, else the one the
// credentials name.
func (o options) tenantName() string {
	if o.tenant != "" {
		return o.tenant
	}
	return o.credsTenant
}

// tenantDevices lists the registry as a tenant may: from the broker's
// registry service.
func (c *Client) tenantDevices(ctx context.Context) ([]Device, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	m, err := c.nc.RequestWithContext(ctx, c.names.ServiceRegistry(), nil)
	if err != nil {
		return nil, fmt.Errorf("client: device registry (%s): %w", c.names.ServiceRegistry(), err)
	}
	if e := m.Header.Get("Nats-Service-Error"); e != "" {
		return nil, fmt.Errorf("client: device registry: %s", e)
	}
	var devs []Device
	if err := json.Unmarshal(m.Data, &devs); err != nil {
		return nil, fmt.Errorf("client: device registry: %w", err)
	}
	slices.SortFunc(devs, func(a, b Device) int { return compareNames(a.Name, b.Name) })
	return devs, nil
}

// waitTenantJobs is Wait for a tenant: it reads each job's result, key
// t.<tenant>.job.<id>, by a direct get, again at growing intervals (up to
// maxJobPoll) until it is there. A tenant may not watch the control
// bucket's stream.
func (c *Client) waitTenantJobs(ctx context.Context, ids []string) ([]*JobResult, error) {
	out := make([]*JobResult, len(ids))
	wait := time.Millisecond
	for left := len(ids); ; {
		for i, id := range ids {
			if out[i] != nil {
				continue
			}
			m, err := c.directGet(ctx, c.names.CtrlStream(), c.names.CtrlSubject(c.names.JobKeyOf(id)))
			if errors.Is(err, errKeyNotFound) || err == nil && m.Header.Get("KV-Operation") != "" {
				continue // not stored yet, or expired
			} else if err != nil {
				if ctx.Err() != nil {
					return out, fmt.Errorf("client: %d of %d jobs unfinished: %w", left, len(ids), ctx.Err())
				}
				return out, fmt.Errorf("client: result of job %s: %w", id, err)
			}
			var r codec.JobResult
			if err := json.Unmarshal(m.Data, &r); err != nil {
				return nil, fmt.Errorf("client: result of job %s: %w", id, err)
			}
			out[i] = &JobResult{JobResult: r, c: c}
			left--
		}
		if left == 0 {
			return out, nil
		}
		select {
		case <-time.After(wait):
			wait = min(2*wait, maxJobPoll)
		case <-ctx.Done():
			return out, fmt.Errorf("client: %d of %d jobs unfinished: %w", left, len(ids), ctx.Err())
		}
	}
}

// maxJobPoll bounds the wait between two reads of a tenant's job results.
const maxJobPoll = 100 * time.Millisecond

// storeTenantGraph stores a tenant's graph under its key t.<tenant>.<name>,
// once: a publish that expects no earlier message on the key's subject.
func (c *Client) storeTenantGraph(ctx context.Context, name string, data []byte) error {
	subj := "$KV." + c.names.GraphBucket() + "." + c.names.GraphKey(name)
	msg := &nats.Msg{Subject: subj, Data: data, Header: nats.Header{"Nats-Expected-Last-Subject-Sequence": []string{"0"}}}
	if _, err := c.js.PublishMsg(ctx, msg); err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			return nil // stored before
		}
		return fmt.Errorf("client: store graph %s: %w", name[:12], err)
	}
	return nil
}

// graphValue reads a stored graph definition: from the bucket, or for a
// tenant by a direct get of its key.
func (c *Client) graphValue(ctx context.Context, name string) ([]byte, error) {
	if c.names.Tenant() != "" {
		m, err := c.directGet(ctx, "KV_"+c.names.GraphBucket(), "$KV."+c.names.GraphBucket()+"."+c.names.GraphKey(name))
		if err != nil {
			return nil, fmt.Errorf("client: graph %s: %w", name, err)
		}
		return m.Data, nil
	}
	kv, err := c.js.KeyValue(ctx, c.names.GraphBucket())
	if err != nil {
		return nil, fmt.Errorf("client: graph bucket: %w", err)
	}
	e, err := kv.Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("client: graph %s: %w", name, err)
	}
	return e.Value(), nil
}
