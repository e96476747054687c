// Package containertest holds Agora's container tests (issue 8): they build
// the FROM scratch images of deploy/images once per test run, start a 3-node
// JetStream cluster from deploy/nats/cluster.conf on a private Docker
// network, provision it at 3 replicas with the provision image, run the
// dispatcher, router and two workers as containers, and drive them from the
// host with pkg/client.
//
// The tests skip without Docker, unless AGORA_REQUIRE_DOCKER=1: then they
// fail. Ryuk is disabled (its image cannot be pulled here) unless
// TESTCONTAINERS_RYUK_DISABLED is set; every container, the network and the
// images are removed by the tests themselves.
//
// The worker image of the tests (worker-test.Dockerfile) adds two static
// sub-agents to the worker: the agora binary (its hidden demo-agent verb
// asks on round 0 and finishes with the answer on round 1) and testagent
// (./testagent, which sleeps: scratch has no sleep).
package containertest
