// Package service holds notifier's domain: what a notification, a task and an attempt are, and the
// two correctness checks that run in PostgreSQL (claim and finish, dispatcher.go). The protocol's
// vocabulary and its pure decisions live in service/delivery (no database dependency, so the channel
// adapters can use it); this package re-exports them under the same names for its callers. Generated
// query code stays in dbgen; callers of this package see only domain types.
package service

// TaskRef names one delivery task of a notification: its id here, and the reference the channel sees
// (random, never reused; a provider's console or receipt shows it, as ntf-<ref> where a key is sent).
type TaskRef struct {
	TaskID  int64  `json:"task_id"`
	Channel string `json:"channel"`
	Ref     string `json:"ref"`
}
