// Package resevent reads the fields every resource event shares (docs/RESOURCE_EVENTS.md):
// its "event" name, component_type, layer, timestamp, duration_us and flops. It is the
// one Go reader of them: control checks an incoming event with it, metrics aggregates by
// it, httpapi filters by it. A leaf: it imports no strapd package.
package resevent
