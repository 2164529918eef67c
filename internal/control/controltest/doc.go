// Package controltest drives a session the way the Python client does (a shm producer ring,
// PUBLISH, RELEASE, DROP) for tests and load generators; it lives outside control so the
// protocol package stays a leaf that knows nothing of the ring.
package controltest
