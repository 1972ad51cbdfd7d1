package client_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jetfabric/jetfabric/client"
)

// A broker that requires TLS, with certificates from jetfabric certs: the
// client trusts its CA and presents a client certificate (needed where the
// broker runs with --tls-verify). A failure says what it most likely means.
func ExampleWithTLS() {
	c, err := client.Connect("tls://127.0.0.1:4222",
		client.WithTLS("tls/ca.pem", "tls/client.pem", "tls/client-key.pem"))
	switch {
	case errors.Is(err, client.ErrTLSUnknownAuthority):
		fmt.Println("give the CA that signed the broker's certificate:", err)
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	defer c.Close()
	devs, err := c.Devices(context.Background())
	fmt.Println(len(devs), err)
}
