package healthcheck_test

import (
	"log"

	"github.com/edgeproxy/edgeproxy/agent/healthcheck"
)

// The agent calls Update after every sync with the healthCheckNodePorts of
// services with externalTrafficPolicy Local and their local endpoint counts.
func ExampleServers_Update() {
	s := healthcheck.New(healthcheck.Options{})
	defer s.Close()
	err := s.Update(map[uint16]healthcheck.Info{
		32000: {Namespace: "default", Name: "web", LocalEndpoints: 2}, // answers 200
		32001: {Namespace: "default", Name: "db", LocalEndpoints: 0},  // answers 503
	})
	if err != nil {
		log.Print(err) // ports that could not be opened; the others are served
	}
}
