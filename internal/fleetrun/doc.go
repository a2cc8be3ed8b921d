// Package fleetrun is the runtime of distributed mode (docs/fleet.md):
// it ties the fleet member (package fleet: who should own which
// partition of the groups topic), the transactional store (package
// kafkastore: who can write it) and the engine (who serves the groups).
// A partition is served here only once the store claimed it and is
// unloaded before it is given up; a newer owner's fence drops it at
// once. Runtime is the engine's ownership gate (Owns), the router's
// proxy.Locator (where a group's owner is) and the admin API's
// /api/fleet (Status). The assembly (internal/kproxy) builds it with
// New, builds the engine over its Store, and starts the member with
// Join.
package fleetrun
