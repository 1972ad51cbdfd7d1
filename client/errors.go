package client

import "errors"

// Errors returned by the client.
var (
	// ErrNoDevice: the device is not registered or not serving.
	ErrNoDevice = errors.New("client: no such device")
	// ErrClosed: the session or client is closed.
	ErrClosed = errors.New("client: closed")
	// ErrInvalidOption wraps option errors.
	ErrInvalidOption = errors.New("client: invalid option")
	// ErrInvalidArgument: a call's arguments are wrong (checked here,
	// before anything is sent).
	ErrInvalidArgument = errors.New("client: invalid argument")
	// ErrDType: the tensor's dtype does not fit the read asked for.
	ErrDType = errors.New("client: dtype mismatch")
	// ErrPublish: a frame was not stored: the stream refused it, or no
	// stream captures its subject.
	ErrPublish = errors.New("client: frame not accepted")
	// ErrSessionFreed: the worker freed the session (it saw no frame and
	// no heartbeat from the client for its idle timeout); its tensors are
	// gone. Open a new session.
	ErrSessionFreed = errors.New("client: session freed by the worker")
)

// Errors of a fabric that cannot serve a call for now. Each wraps
// ErrUnavailable; the call's error names the cause and what to do. The
// frames of a call that failed so go on being published in the
// background, and the session carries on when the fabric is back.
var (
	// ErrUnavailable: the fabric did not answer within the fail-fast
	// time (WithFailFast).
	ErrUnavailable = errors.New("client: fabric unavailable")
	// ErrDisconnected: the client has no connection to any broker node.
	ErrDisconnected = errors.New("no connection to the broker")
	// ErrNoLeader: the op stream has no leader (no responders): its
	// leader's node is down and no other has taken over yet.
	ErrNoLeader = errors.New("the op stream has no leader")
	// ErrNoQuorum: JetStream itself has no leader: a majority of the
	// cluster's nodes is down.
	ErrNoQuorum = errors.New("the cluster has lost its quorum")
)

// ErrCredentials: the credentials were refused by the broker, or expired
// before the client used them; the message names the file and the cause.
var ErrCredentials = errors.New("client: credentials refused")
