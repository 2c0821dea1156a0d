// Package webhook protects the shard and drain labels of every ring's
// objects with a validating admission webhook (docs/design.md §6).
//
// Setup is the one entry point: it registers the admission handler on the
// manager's webhook server, keeps the ValidatingWebhookConfiguration in line
// with the ControllerRings (on the leader), and, by default, creates and
// rotates the webhook's CA and serving certificate in a Secret shared by all
// replicas. The handler runs on every replica, so admission keeps working
// while leadership moves.
//
// The configuration holds two webhooks per ring,
// <ring>.shard-label.sharder.dev and <ring>.drain-label.sharder.dev: an
// objectSelector cannot match "this label or that one". Through their
// objectSelectors and matchConditions the API server sends the webhook only
// requests that change one of a ring's two labels on one of its resources.
// The handler allows such a change only when it comes from the sharder
// replica that leads (Options.LeaderLease: its field manager,
// LeaderFieldManager, names the holder of the leader-election Lease), when
// it is a drain acknowledgement by one of the ring's instance service
// accounts, or the creation of an object labelled with the instance
// the sharder would choose for it (a main object: the ring's lookup over its
// ready instances; a controlled object: its controller's instance). It
// denies everything else with a message naming the label, the ring and what
// to do instead. Rings are built off the request path, per ring, as the
// membership changes (ringBuilds); a request reads the ring built last and
// takes its pick only while that instance is ready. When it cannot decide (caches not synced, an unknown ring,
// an API error) it follows the ring's failure policy: under Ignore it allows
// with a warning.
package webhook
