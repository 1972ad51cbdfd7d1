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
